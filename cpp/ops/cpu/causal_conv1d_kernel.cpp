// causal_conv1d CPU kernels; compiled once per CPU capability
// (FuseopsCpuKernels.cmake).
//
// The op is memory bound (width <= 4 multiply-adds per element), so each
// kernel reads every input once and writes every output once:
//  - rows layout (time contiguous): one (batch, channel) row per step of a
//    parallel loop, vectorised over time; the width shifted windows of a
//    block are unaligned loads of the same cache lines;
//  - channel-last layout: tasks of (batch, 128 time steps, up to 4096
//    channels), vectorised over channels. A task walks whole rows (Mamba's
//    dims), so memory sees one sequential stream per tensor, where the rows
//    of a narrower tile would each start a new one.
// The backward recomputes the pre-activation from x (a few multiply-adds)
// instead of saving it (a tensor the size of x). Per-row (rows) or per-task
// (channel-last) partial sums of grad_weight/grad_bias are added in a fixed
// order afterwards: the result depends on the shapes only, not on the
// number of threads.
// bfloat16/float16 are widened to float32 before any arithmetic.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>

#include "ops/causal_conv1d_dispatch.h"
#include "ops/cpu/activation_math.h"
#include "ops_generated/cpu/causal_conv1d.h"
#include "ops/cpu/elementwise.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

using detail::ConvLayout;
using detail::dispatch_width_silu;

// Channel-last tasks: time steps and channels per task. Fixed (not derived
// from the thread count), so the order of the weight-gradient sums is too.
constexpr int64_t kTimeChunk = 128;
constexpr int64_t kChannelTile = 4096;

template <typename T>
using acc_type = at::opmath_type<T>;

// Pre-activation -> output, and the output gradient -> the pre-activation's.
template <bool kSilu, typename V>
C10_ALWAYS_INLINE V activate(const V& pre) {
  if constexpr (kSilu) {
    return activation_value<Activation::Silu>(pre);
  } else {
    return pre;
  }
}

template <bool kSilu, typename V>
C10_ALWAYS_INLINE V activation_grad(const V& grad, const V& pre) {
  if constexpr (kSilu) {
    return grad * activation_derivative<Activation::Silu, false>(pre, nullptr);
  } else {
    return grad;
  }
}

// Lanes [count, size) of `v` set to zero.
template <typename V>
C10_ALWAYS_INLINE V keep_first(const V& v, int64_t count) {
  using S = typename V::value_type;
  return V::blendv(V(S(0)), v, V::arange(S(0), S(1)) < V(static_cast<S>(count)));
}

template <typename S>
S lane_sum(const at::vec::Vectorized<S>& v) {
  alignas(64) S lanes[at::vec::Vectorized<S>::size()];
  v.store(lanes);
  S sum = 0;
  for (S lane : lanes) {
    sum += lane;
  }
  return sum;
}

// ---------------------------------------------------------------------------
// Rows layout

// Block t of a row starts at output t; its window k is x[t - (W-1) + k ..].
// The first block reads `head`: the W-1 states, then the row's first
// outputs' inputs, then zeros.
template <typename T, int W>
struct RowHead {
  using Block = OpmathBlock<T>;
  T values[W - 1 + Block::kSize];

  RowHead(const T* x, const T* states, int64_t seqlen) {
    for (int j = 0; j < W - 1; ++j) {
      values[j] = states != nullptr ? states[j] : T(0);
    }
    for (int64_t i = 0; i < Block::kSize; ++i) {
      values[W - 1 + i] = i < seqlen ? x[i] : T(0);
    }
  }
};

template <typename T, int W, bool kSilu>
void forward_row(T* out, const T* x, const T* states, const acc_type<T>* w, acc_type<T> bias,
                 int64_t seqlen) {
  using Block = OpmathBlock<T>;
  using Vec = typename Block::Vec;
  constexpr int R = Block::kRegisters;
  constexpr int64_t N = Block::kSize;
  Vec wv[W];
  for (int k = 0; k < W; ++k) {
    wv[k] = Vec(w[k]);
  }
  const RowHead<T, W> head(x, states, seqlen);
  for (int64_t t = 0; t < seqlen; t += N) {
    const int64_t count = std::min(N, seqlen - t);
    typename Block::Registers acc;
    acc.fill(Vec(bias));
    for (int k = 0; k < W; ++k) {
      const auto window =
          t == 0 ? Block::load(head.values + k) : Block::load(x + t - (W - 1) + k, count);
      for (int r = 0; r < R; ++r) {
        acc[r] = at::vec::fmadd(wv[k], window[r], acc[r]);
      }
    }
    for (auto& v : acc) {
      v = activate<kSilu>(v);
    }
    Block::store(out + t, acc, count);
  }
}

// One row's backward. With g = grad_out * act'(pre) and xp = states ++ x:
//   grad_x[t]      = sum_k w[k] g[t + W-1 - k]  (+ grad_final[t - (L - (W-1))])
//   grad_states[j] = sum_{k <= j} w[k] g[j - k] (+ grad_final[j - L])
//   grad_w[k]      = sum_t g[t] xp[t + k],  grad_b = sum_t g[t]
// g goes to `g` (length >= L + W - 1 + N; zero past L) in a first pass that
// also sums grad_w and grad_b from the windows it loads anyway.
template <typename T, int W, bool kSilu>
void backward_row(T* grad_x, T* grad_states, acc_type<T>* grad_wb, const T* grad_out, const T* x,
                  const T* states, const T* grad_final, const acc_type<T>* w, acc_type<T> bias,
                  int64_t seqlen, acc_type<T>* g) {
  using acc_t = acc_type<T>;
  using Block = OpmathBlock<T>;
  using Vec = typename Block::Vec;
  constexpr int R = Block::kRegisters;
  constexpr int64_t N = Block::kSize;
  constexpr int64_t V = Vec::size();
  Vec wv[W];
  for (int k = 0; k < W; ++k) {
    wv[k] = Vec(w[k]);
  }
  Vec dw[W][R];
  Vec db[R];
  for (int r = 0; r < R; ++r) {
    db[r] = Vec(acc_t(0));
    for (int k = 0; k < W; ++k) {
      dw[k][r] = Vec(acc_t(0));
    }
  }
  const RowHead<T, W> head(x, states, seqlen);
  for (int64_t t = 0; t < seqlen; t += N) {
    const int64_t count = std::min(N, seqlen - t);
    typename Block::Registers window[W];
    typename Block::Registers pre;
    pre.fill(Vec(bias));
    for (int k = 0; k < W; ++k) {
      window[k] = t == 0 ? Block::load(head.values + k) : Block::load(x + t - (W - 1) + k, count);
      for (int r = 0; r < R; ++r) {
        pre[r] = at::vec::fmadd(wv[k], window[k][r], pre[r]);
      }
    }
    const auto dy = Block::load(grad_out + t, count);
    for (int r = 0; r < R; ++r) {
      Vec gr = activation_grad<kSilu>(dy[r], pre[r]);
      if (count < N) {
        // Lanes past the row: whatever act'(bias) is, they add nothing.
        gr = keep_first(gr, count - r * V);
      }
      gr.store(g + t + r * V);
      db[r] = db[r] + gr;
      for (int k = 0; k < W; ++k) {
        dw[k][r] = at::vec::fmadd(gr, window[k][r], dw[k][r]);
      }
    }
  }
  std::fill(g + seqlen, g + seqlen + (W - 1) + N, acc_t(0));
  for (int k = 0; k < W; ++k) {
    Vec sum = dw[k][0];
    for (int r = 1; r < R; ++r) {
      sum = sum + dw[k][r];
    }
    grad_wb[k] = lane_sum(sum);
  }
  Vec bsum = db[0];
  for (int r = 1; r < R; ++r) {
    bsum = bsum + db[r];
  }
  grad_wb[W] = lane_sum(bsum);

  // The last W-1 positions of the row also receive the final states' gradient.
  const int64_t final_begin = seqlen - (W - 1);
  for (int64_t t = 0; t < seqlen; t += N) {
    const int64_t count = std::min(N, seqlen - t);
    typename Block::Registers acc;
    for (int r = 0; r < R; ++r) {
      acc[r] = Vec(acc_t(0));
      for (int k = 0; k < W; ++k) {
        acc[r] = at::vec::fmadd(wv[k], Vec::loadu(g + t + r * V + (W - 1) - k), acc[r]);
      }
    }
    if (grad_final != nullptr && t + count > final_begin) {
      alignas(64) acc_t extra[N];
      for (int64_t i = 0; i < N; ++i) {
        const int64_t j = t + i - final_begin;
        extra[i] = i < count && j >= 0 ? static_cast<acc_t>(grad_final[j]) : acc_t(0);
      }
      for (int r = 0; r < R; ++r) {
        acc[r] = acc[r] + Vec::loadu(extra + r * V);
      }
    }
    Block::store(grad_x + t, acc, count);
  }
  for (int j = 0; j < W - 1; ++j) {
    acc_t sum = 0;
    for (int k = 0; k <= j; ++k) {
      sum += w[k] * g[j - k];
    }
    if (grad_final != nullptr && j >= seqlen) {
      sum += static_cast<acc_t>(grad_final[j - seqlen]);
    }
    grad_states[j] = static_cast<T>(sum);
  }
}

// Row `row` = b * dim + c of x [B, D, L] in the row layout (time steps
// contiguous, batch and channel strides any).
template <typename T>
struct StridedRows {
  const T* x;
  int64_t batch_stride, channel_stride, dim;

  explicit StridedRows(const at::Tensor& x_)
      : x(x_.const_data_ptr<T>()),
        batch_stride(x_.stride(0)),
        channel_stride(x_.stride(1)),
        dim(x_.size(1)) {}

  const T* operator[](int64_t row) const {
    return x + row / dim * batch_stride + row % dim * channel_stride;
  }
};

// ---------------------------------------------------------------------------
// Channel-last layout

// Where time step t of batch b starts (a row of `dim` channels): x itself,
// the initial states for t < 0, or zeros without them.
template <typename T>
struct ChannelLastRows {
  const T* x;
  int64_t batch_stride, time_stride, dim, width;
  const T* states;  // (batch, width-1, dim) dense, or nullptr
  std::vector<T> zeros;

  ChannelLastRows(const at::Tensor& x_, const T* states_, int64_t width_)
      : x(x_.const_data_ptr<T>()),
        batch_stride(x_.stride(0)),
        time_stride(x_.stride(2)),
        dim(x_.size(1)),
        width(width_),
        states(states_),
        zeros(dim + OpmathBlock<T>::kSize, T(0)) {}

  const T* at(int64_t b, int64_t t) const {
    if (t >= 0) {
      return x + b * batch_stride + t * time_stride;
    }
    if (states == nullptr) {
      return zeros.data();
    }
    return states + (b * (width - 1) + (width - 1) + t) * dim;
  }
};

// weight (dim, W) transposed to (W, dim), and bias (or zeros), in acc_t;
// padded by a vector, so that loads at a tile's last channels stay inside.
template <typename acc_t>
struct ChannelParams {
  static constexpr int64_t kPad = 2 * at::vec::Vectorized<acc_t>::size();
  std::vector<acc_t> w;
  std::vector<acc_t> b;

  ChannelParams(const at::Tensor& weight, const at::Tensor& bias, int64_t dim, int64_t width)
      : w(dim * width + kPad, acc_t(0)), b(dim + kPad, acc_t(0)) {
    const acc_t* wp = weight.const_data_ptr<acc_t>();
    for (int64_t c = 0; c < dim; ++c) {
      for (int64_t k = 0; k < width; ++k) {
        w[k * dim + c] = wp[c * width + k];
      }
    }
    if (bias.defined()) {
      std::copy_n(bias.const_data_ptr<acc_t>(), dim, b.data());
    }
  }
};

int64_t time_chunks(int64_t seqlen) { return (seqlen + kTimeChunk - 1) / kTimeChunk; }

// Calls fn(b, chunk, t0, t1, c0, c1) for every channel-last task.
template <typename Fn>
void parallel_channel_tasks(int64_t batch, int64_t seqlen, int64_t dim, const Fn& fn) {
  const int64_t chunks = time_chunks(seqlen);
  const int64_t tiles = (dim + kChannelTile - 1) / kChannelTile;
  at::parallel_for(0, batch * chunks * tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t tile = task % tiles;
      const int64_t chunk = (task / tiles) % chunks;
      const int64_t b = task / (tiles * chunks);
      const int64_t t0 = chunk * kTimeChunk;
      const int64_t c0 = tile * kChannelTile;
      fn(b, chunk, t0, std::min(seqlen, t0 + kTimeChunk), c0, std::min(dim, c0 + kChannelTile));
    }
  });
}

template <typename T, int W, bool kSilu>
void forward_channel_last(T* out, const ChannelLastRows<T>& rows,
                          const ChannelParams<acc_type<T>>& p, int64_t batch, int64_t seqlen) {
  using Block = OpmathBlock<T>;
  using Vec = typename Block::Vec;
  constexpr int R = Block::kRegisters;
  constexpr int64_t N = Block::kSize;
  constexpr int64_t V = Vec::size();
  const int64_t dim = rows.dim;
  parallel_channel_tasks(
      batch, seqlen, dim, [&](int64_t b, int64_t, int64_t t0, int64_t t1, int64_t c0, int64_t c1) {
        for (int64_t t = t0; t < t1; ++t) {
          const T* in[W];
          for (int k = 0; k < W; ++k) {
            in[k] = rows.at(b, t - (W - 1) + k);
          }
          T* dst = out + (b * seqlen + t) * dim;
          for (int64_t c = c0; c < c1; c += N) {
            const int64_t count = std::min(N, c1 - c);
            typename Block::Registers acc;
            for (int r = 0; r < R; ++r) {
              acc[r] = Vec::loadu(p.b.data() + c + r * V);
            }
            for (int k = 0; k < W; ++k) {
              const auto window = Block::load(in[k] + c, count);
              for (int r = 0; r < R; ++r) {
                acc[r] =
                    at::vec::fmadd(Vec::loadu(p.w.data() + k * dim + c + r * V), window[r], acc[r]);
              }
            }
            for (auto& v : acc) {
              v = activate<kSilu>(v);
            }
            Block::store(dst + c, acc, count);
          }
        }
      });
}

// The backward of one task walks its time steps once: step t computes the
// row of g = grad_out * act'(pre) at t (into a ring of the last W rows) and
// then finishes grad_x at t - (W-1), whose window g[t - (W-1) .. t] is then
// complete. The task recomputes the W-1 rows of g after its chunk, which
// the next chunk computes again (1/43 of the work at width 4). Its sums of
// grad_weight and grad_bias over its own rows go to `partials`
// (batch * chunks, W + 1, dim).
template <typename T, int W, bool kSilu>
void backward_channel_last(T* grad_x, T* grad_states, acc_type<T>* partials, const T* grad_out,
                           const ChannelLastRows<T>& rows, const T* grad_final,
                           const ChannelParams<acc_type<T>>& p, int64_t batch, int64_t seqlen) {
  using acc_t = acc_type<T>;
  using Block = OpmathBlock<T>;
  using Vec = typename Block::Vec;
  constexpr int R = Block::kRegisters;
  constexpr int64_t N = Block::kSize;
  constexpr int64_t V = Vec::size();
  const int64_t dim = rows.dim;
  const int64_t chunks = time_chunks(seqlen);
  parallel_channel_tasks(
      batch, seqlen, dim,
      [&](int64_t b, int64_t chunk, int64_t t0, int64_t t1, int64_t c0, int64_t c1) {
        // Rows are padded by a block: lanes past c1 are computed and never read.
        const int64_t stride = c1 - c0 + N;
        std::vector<acc_t> ring(W * stride);
        std::vector<acc_t> sums((W + 1) * stride, acc_t(0));
        auto g_row = [&](int64_t t) { return ring.data() + (t % W) * stride; };
        const acc_t* w = p.w.data();
        for (int64_t t = t0; t < t1 + W - 1; ++t) {
          acc_t* g = g_row(t);
          if (t < seqlen) {
            const T* in[W];
            for (int k = 0; k < W; ++k) {
              in[k] = rows.at(b, t - (W - 1) + k);
            }
            const T* dy = grad_out + (b * seqlen + t) * dim;
            const bool own = t < t1;
            for (int64_t c = c0; c < c1; c += N) {
              const int64_t count = std::min(N, c1 - c);
              typename Block::Registers window[W];
              typename Block::Registers pre;
              for (int r = 0; r < R; ++r) {
                pre[r] = Vec::loadu(p.b.data() + c + r * V);
              }
              for (int k = 0; k < W; ++k) {
                window[k] = Block::load(in[k] + c, count);
                for (int r = 0; r < R; ++r) {
                  pre[r] =
                      at::vec::fmadd(Vec::loadu(w + k * dim + c + r * V), window[k][r], pre[r]);
                }
              }
              const auto dyv = Block::load(dy + c, count);
              for (int r = 0; r < R; ++r) {
                const int64_t i = c - c0 + r * V;
                const Vec gr = activation_grad<kSilu>(dyv[r], pre[r]);
                gr.store(g + i);
                if (own) {
                  for (int k = 0; k < W; ++k) {
                    acc_t* s = sums.data() + k * stride + i;
                    at::vec::fmadd(gr, window[k][r], Vec::loadu(s)).store(s);
                  }
                  acc_t* s = sums.data() + W * stride + i;
                  (Vec::loadu(s) + gr).store(s);
                }
              }
            }
          } else {
            std::fill(g, g + stride, acc_t(0));
          }

          const int64_t s = t - (W - 1);
          if (s >= t0) {
            const acc_t* gk[W];
            for (int k = 0; k < W; ++k) {
              gk[k] = g_row(t - k);
            }
            const int64_t final_row = s - (seqlen - (W - 1));
            const T* fin = grad_final != nullptr && final_row >= 0
                               ? grad_final + (b * (W - 1) + final_row) * dim
                               : nullptr;
            T* dst = grad_x + (b * seqlen + s) * dim;
            for (int64_t c = c0; c < c1; c += N) {
              const int64_t count = std::min(N, c1 - c);
              typename Block::Registers acc;
              for (int r = 0; r < R; ++r) {
                const int64_t i = c - c0 + r * V;
                acc[r] = Vec(acc_t(0));
                for (int k = 0; k < W; ++k) {
                  acc[r] = at::vec::fmadd(Vec::loadu(w + k * dim + c + r * V),
                                          Vec::loadu(gk[k] + i), acc[r]);
                }
              }
              if (fin != nullptr) {
                const auto extra = Block::load(fin + c, count);
                for (int r = 0; r < R; ++r) {
                  acc[r] = acc[r] + extra[r];
                }
              }
              Block::store(dst + c, acc, count);
            }
          }

          if (t0 == 0 && t == W - 2) {
            // The ring holds g rows 0 .. W-2: the initial states' gradient.
            for (int j = 0; j < W - 1; ++j) {
              T* dst = grad_states + (b * (W - 1) + j) * dim;
              const T* fin = grad_final != nullptr && j >= seqlen
                                 ? grad_final + (b * (W - 1) + j - seqlen) * dim
                                 : nullptr;
              for (int64_t c = c0; c < c1; ++c) {
                acc_t sum = 0;
                for (int k = 0; k <= j; ++k) {
                  sum += w[k * dim + c] * g_row(j - k)[c - c0];
                }
                if (fin != nullptr) {
                  sum += static_cast<acc_t>(fin[c]);
                }
                dst[c] = static_cast<T>(sum);
              }
            }
          }
        }
        acc_t* part = partials + (b * chunks + chunk) * (W + 1) * dim;
        for (int q = 0; q <= W; ++q) {
          std::copy_n(sums.data() + q * stride, c1 - c0, part + q * dim + c0);
        }
      });
}

// grad_weight (dim, W) and grad_bias (dim) from `parts` partial sums laid
// out (parts, W + 1, dim), added in part order.
template <typename acc_t>
void reduce_channel_partials(acc_t* grad_weight, acc_t* grad_bias, const acc_t* partials,
                             int64_t parts, int64_t dim, int64_t width) {
  using Vec = at::vec::Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  at::parallel_for(0, dim, 4 * V, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; c += V) {
      const int64_t count = std::min(V, end - c);
      for (int64_t q = 0; q <= width; ++q) {
        Vec sum(acc_t(0));
        for (int64_t part = 0; part < parts; ++part) {
          sum = sum + Vec::loadu(partials + (part * (width + 1) + q) * dim + c, count);
        }
        alignas(64) acc_t lanes[V];
        sum.store(lanes);
        for (int64_t i = 0; i < count; ++i) {
          if (q < width) {
            grad_weight[(c + i) * width + q] = lanes[i];
          } else {
            grad_bias[c + i] = lanes[i];
          }
        }
      }
    }
  });
}

// ---------------------------------------------------------------------------
// Entry points

void causal_conv1d_kernel_impl(const at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, const at::Tensor& states, bool silu,
                               ConvLayout layout) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, x.scalar_type(), "fuseops::causal_conv1d", [&] {
        using acc_t = acc_type<scalar_t>;
        const int64_t batch = x.size(0);
        const int64_t dim = x.size(1);
        const int64_t seqlen = x.size(2);
        const scalar_t* sp = states.defined() ? states.const_data_ptr<scalar_t>() : nullptr;
        const acc_t* wp = weight.const_data_ptr<acc_t>();
        const acc_t* bp = bias.defined() ? bias.const_data_ptr<acc_t>() : nullptr;
        scalar_t* op = out.mutable_data_ptr<scalar_t>();
        dispatch_width_silu(weight.size(1), silu, [&](auto width, auto with_silu) {
          constexpr int W = decltype(width)::value;
          constexpr bool kSilu = decltype(with_silu)::value;
          if (layout == ConvLayout::kChannelLast) {
            const ChannelLastRows<scalar_t> rows(x, sp, W);
            forward_channel_last<scalar_t, W, kSilu>(
                op, rows, ChannelParams<acc_t>(weight, bias, dim, W), batch, seqlen);
            return;
          }
          const StridedRows<scalar_t> x_rows(x);
          at::parallel_for(0, batch * dim, row_grain(seqlen), [&](int64_t begin, int64_t end) {
            for (int64_t row = begin; row < end; ++row) {
              const int64_t c = row % dim;
              forward_row<scalar_t, W, kSilu>(op + row * seqlen, x_rows[row],
                                              sp != nullptr ? sp + row * (W - 1) : nullptr,
                                              wp + c * W, bp != nullptr ? bp[c] : acc_t(0), seqlen);
            }
          });
        });
      });
}

void causal_conv1d_backward_kernel_impl(const at::Tensor& grad_x, const at::Tensor& grad_weight,
                                        const at::Tensor& grad_bias, const at::Tensor& grad_states,
                                        const at::Tensor& grad_output, const at::Tensor& x,
                                        const at::Tensor& weight, const at::Tensor& bias,
                                        const at::Tensor& states, const at::Tensor& grad_final,
                                        bool silu, ConvLayout layout) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, x.scalar_type(), "fuseops::causal_conv1d_backward", [&] {
        using acc_t = acc_type<scalar_t>;
        using Block = OpmathBlock<scalar_t>;
        const int64_t batch = x.size(0);
        const int64_t dim = x.size(1);
        const int64_t seqlen = x.size(2);
        const scalar_t* dyp = grad_output.const_data_ptr<scalar_t>();
        const scalar_t* sp = states.defined() ? states.const_data_ptr<scalar_t>() : nullptr;
        const scalar_t* fp = grad_final.defined() ? grad_final.const_data_ptr<scalar_t>() : nullptr;
        const acc_t* wp = weight.const_data_ptr<acc_t>();
        const acc_t* bp = bias.defined() ? bias.const_data_ptr<acc_t>() : nullptr;
        scalar_t* dxp = grad_x.mutable_data_ptr<scalar_t>();
        scalar_t* dsp = grad_states.mutable_data_ptr<scalar_t>();
        acc_t* dwp = grad_weight.mutable_data_ptr<acc_t>();
        acc_t* dbp = grad_bias.mutable_data_ptr<acc_t>();
        dispatch_width_silu(weight.size(1), silu, [&](auto width, auto with_silu) {
          constexpr int W = decltype(width)::value;
          constexpr bool kSilu = decltype(with_silu)::value;
          if (layout == ConvLayout::kChannelLast) {
            const ChannelLastRows<scalar_t> rows(x, sp, W);
            const int64_t parts = batch * time_chunks(seqlen);
            std::vector<acc_t> partials(parts * (W + 1) * dim);
            backward_channel_last<scalar_t, W, kSilu>(dxp, dsp, partials.data(), dyp, rows, fp,
                                                      ChannelParams<acc_t>(weight, bias, dim, W),
                                                      batch, seqlen);
            reduce_channel_partials(dwp, dbp, partials.data(), parts, dim, W);
            return;
          }
          const StridedRows<scalar_t> x_rows(x);
          std::vector<acc_t> partials(batch * dim * (W + 1));
          at::parallel_for(0, batch * dim, row_grain(seqlen), [&](int64_t begin, int64_t end) {
            std::vector<acc_t> g(seqlen + W + Block::kSize);
            for (int64_t row = begin; row < end; ++row) {
              const int64_t c = row % dim;
              backward_row<scalar_t, W, kSilu>(
                  dxp + row * seqlen, dsp + row * (W - 1), partials.data() + row * (W + 1),
                  dyp + row * seqlen, x_rows[row], sp != nullptr ? sp + row * (W - 1) : nullptr,
                  fp != nullptr ? fp + row * (W - 1) : nullptr, wp + c * W,
                  bp != nullptr ? bp[c] : acc_t(0), seqlen, g.data());
            }
          });
          // Each channel's sums over the batch, in batch order.
          at::parallel_for(0, dim, 1024, [&](int64_t begin, int64_t end) {
            for (int64_t c = begin; c < end; ++c) {
              for (int q = 0; q <= W; ++q) {
                acc_t sum = 0;
                for (int64_t b = 0; b < batch; ++b) {
                  sum += partials[(b * dim + c) * (W + 1) + q];
                }
                if (q < W) {
                  dwp[c * W + q] = sum;
                } else {
                  dbp[c] = sum;
                }
              }
            }
          });
        });
      });
}

// Decoding steps are small (seqlen 1 per call, typically): one scalar
// (batch, channel) row per step of the parallel loop, any strides.
void causal_conv1d_update_kernel_impl(const at::Tensor& out, const at::Tensor& x,
                                      const at::Tensor& conv_state, const at::Tensor& weight,
                                      const at::Tensor& bias, bool silu) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, x.scalar_type(), "fuseops::causal_conv1d_update", [&] {
        using acc_t = acc_type<scalar_t>;
        const int64_t dim = x.size(1);
        const int64_t seqlen = x.size(2);
        const int64_t state_len = conv_state.size(2);
        const int64_t width = weight.size(1);
        const scalar_t* xp = x.const_data_ptr<scalar_t>();
        scalar_t* stp = conv_state.mutable_data_ptr<scalar_t>();
        scalar_t* op = out.mutable_data_ptr<scalar_t>();
        const acc_t* wp = weight.const_data_ptr<acc_t>();
        const acc_t* bp = bias.defined() ? bias.const_data_ptr<acc_t>() : nullptr;
        const int64_t grain = row_grain(seqlen + state_len);
        at::parallel_for(0, x.size(0) * dim, grain, [&](int64_t begin, int64_t end) {
          for (int64_t row = begin; row < end; ++row) {
            const int64_t b = row / dim;
            const int64_t c = row % dim;
            const scalar_t* xr = xp + b * x.stride(0) + c * x.stride(1);
            scalar_t* st = stp + b * conv_state.stride(0) + c * conv_state.stride(1);
            const int64_t sx = x.stride(2);
            const int64_t ss = conv_state.stride(2);
            // Element i of conv_state ++ x.
            auto joined = [&](int64_t i) {
              return static_cast<acc_t>(i < state_len ? st[i * ss] : xr[(i - state_len) * sx]);
            };
            for (int64_t t = 0; t < seqlen; ++t) {
              acc_t acc = bp != nullptr ? bp[c] : acc_t(0);
              for (int64_t k = 0; k < width; ++k) {
                acc += wp[c * width + k] * joined(state_len + t - (width - 1) + k);
              }
              if (silu) {
                acc = acc / (acc_t(1) + std::exp(-acc));
              }
              op[row * seqlen + t] = static_cast<scalar_t>(acc);
            }
            // Element j of the new state is element seqlen + j of the
            // joined sequence, read before this loop overwrites it.
            for (int64_t j = 0; j < state_len; ++j) {
              const int64_t i = seqlen + j;
              st[j * ss] = i < state_len ? st[i * ss] : xr[(i - state_len) * sx];
            }
          }
        });
      });
}

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(CausalConv1dCpuKernels::forward, &causal_conv1d_kernel_impl);
FUSEOPS_REGISTER_CPU_KERNEL(CausalConv1dCpuKernels::backward, &causal_conv1d_backward_kernel_impl);
FUSEOPS_REGISTER_CPU_KERNEL(CausalConv1dCpuKernels::update, &causal_conv1d_update_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
