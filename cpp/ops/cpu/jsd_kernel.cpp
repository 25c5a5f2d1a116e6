// jsd CPU kernels; compiled once per CPU capability (FuseopsCpuKernels.cmake).
//
// Rows are processed in parallel, each row whole by one thread, so that a
// row's sums (and the loss) have the same bits whatever the thread count.
// The forward reads each row of the student and the teacher once for its
// logsumexp (online maximum and sum of exp per vector lane, as
// cross_entropy's), then once more, from cache (2 x 125 KiB at 32000 float32
// classes), for the divergence sums; it keeps per row both logsumexps and the
// student's sum, from which the backward computes the gradient in one pass
// that reads both rows and writes the gradient once. All arithmetic is in
// float32 (float64 for float64).
//
// The student's sum that the backward subtracts, K_s, is kept normalized by
// the row's computed total probability Z = sum exp(s): lse_s rounded to
// float32 shifts every s by the same delta (up to half an ulp of the
// logsumexp, 1e-6 at 21), which scales every p by 1 - delta; unnormalized,
// K_s then moves by delta (K_s + 1) while s - t moves by delta, and each
// gradient element p (s - t - K_s) is off by p delta K_s, a relative error
// of delta K_s / (s - t - K_s), 1e-4 for a K_s of 18 and a difference of
// 0.2. Divided by Z, K_s moves by delta too and the difference keeps only
// its own roundings.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include "ops/cpu/activation_math.h"
#include "ops/cpu/elementwise.h"
#include "ops_generated/cpu/jsd.h"
#include "ops/cpu/row_max_sum.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

using detail::JsdMode;

// A row's logits divided by the temperature, as x * (1 / T).
template <typename acc_t>
struct ScaledLogit {
  acc_t scale;
  Vec<acc_t> operator()(const Vec<acc_t>& x) const { return x * Vec<acc_t>(scale); }
  acc_t operator()(acc_t x) const { return x * scale; }
};

// Every pass scales the logits as row_max_sum does, x * (1 / T) rounded
// before anything is subtracted (no fused multiply-add), so that the row's
// maximum gives exactly log p = -log(sum): with logits of 1e4, a fused
// product's extra bits would move log p of the likeliest class by its
// rounding error (2^-24 of the logit), and that error, in p, multiplies
// differences of log-probabilities as large as the logits.
// What a row's passes share: 1 / T, the two logsumexps of the scaled rows,
// log beta and log(1 - beta) (the mixture's).
template <typename acc_t>
struct RowConstants {
  acc_t inv_t;
  acc_t lse_s;
  acc_t lse_t;
  acc_t log_beta;
  acc_t log_1m_beta;
};

// The same constants in every lane, for a row's vector body.
template <typename acc_t>
struct RowVectors {
  explicit RowVectors(const RowConstants<acc_t>& k)
      : inv_t(k.inv_t),
        lse_s(k.lse_s),
        lse_t(k.lse_t),
        log_beta(k.log_beta),
        log_1m_beta(k.log_1m_beta) {}
  Vec<acc_t> inv_t;
  Vec<acc_t> lse_s;
  Vec<acc_t> lse_t;
  Vec<acc_t> log_beta;
  Vec<acc_t> log_1m_beta;
};

// exp of a vector (activation_math.h's) or of a row's scalar tail.
template <typename acc_t>
C10_ALWAYS_INLINE Vec<acc_t> exp_of(const Vec<acc_t>& x) {
  return activation_exp<acc_t>(x);
}

template <typename acc_t>
C10_ALWAYS_INLINE acc_t exp_of(acc_t x) {
  return std::exp(x);
}

// prob * diff, 0 where prob is 0: the limit of p log p, so that a class
// with -Inf logits (prob 0, diff -Inf) adds 0, not NaN.
template <typename acc_t>
C10_ALWAYS_INLINE Vec<acc_t> weighted(const Vec<acc_t>& prob, const Vec<acc_t>& diff) {
  using V = Vec<acc_t>;
  return V::blendv(prob * diff, V(0), prob == V(0));
}

template <typename acc_t>
C10_ALWAYS_INLINE acc_t weighted(acc_t prob, acc_t diff) {
  return prob == acc_t(0) ? acc_t(0) : prob * diff;
}

// log M = logaddexp(a, c) = max(a, c) + log1p(exp(-|a - c|)), with
// a = t + log beta and c = s + log(1 - beta): finite wherever either is,
// exact to rounding however small both probabilities are.
template <typename acc_t>
C10_ALWAYS_INLINE Vec<acc_t> log_mixture(const Vec<acc_t>& a, const Vec<acc_t>& c) {
  return at::vec::maximum(a, c) + activation_exp<acc_t>((a - c).abs().neg()).log1p();
}

template <typename acc_t>
C10_ALWAYS_INLINE acc_t log_mixture(acc_t a, acc_t c) {
  const acc_t hi = (a > c || std::isnan(a)) ? a : c;
  return hi + std::log1p(std::exp(-std::abs(a - c)));
}

// A row's sums: K_s = sum p (s - m) and K_t = sum q (t - m) for the
// mixture; K_s = sum p (s - t) (and K_t = 0) for reverse KL; K_t =
// sum q (t - s) (and K_s = 0) for forward KL; and Z = sum p where K_s is
// used (the header's normalization).
template <typename S>
struct RowSums {
  S ks;
  S kt;
  S z;
};

template <JsdMode kMode, typename acc_t, typename S>
C10_ALWAYS_INLINE void add_terms(const S& s, const S& t, const S& log_beta, const S& log_1m_beta,
                                 RowSums<S>& sums) {
  if constexpr (kMode == JsdMode::ForwardKl) {
    sums.kt += weighted<acc_t>(exp_of<acc_t>(t), t - s);
  } else if constexpr (kMode == JsdMode::ReverseKl) {
    const S p = exp_of<acc_t>(s);
    sums.ks += weighted<acc_t>(p, s - t);
    sums.z += p;
  } else {
    const S m = log_mixture<acc_t>(t + log_beta, s + log_1m_beta);
    const S p = exp_of<acc_t>(s);
    sums.ks += weighted<acc_t>(p, s - m);
    sums.z += p;
    sums.kt += weighted<acc_t>(exp_of<acc_t>(t), t - m);
  }
}

// The lanes of a vector summed in order, the same on every thread count.
template <typename acc_t>
acc_t lane_sum(const Vec<acc_t>& v) {
  alignas(64) acc_t lanes[Vec<acc_t>::size()];
  v.store(lanes);
  acc_t sum = 0;
  for (int l = 0; l < Vec<acc_t>::size(); ++l) {
    sum += lanes[l];
  }
  return sum;
}

template <typename T, JsdMode kMode>
RowSums<at::opmath_type<T>> row_divergence(const T* x, const T* y, int64_t n,
                                           const RowConstants<at::opmath_type<T>>& k) {
  using acc_t = at::opmath_type<T>;
  using V = Vec<acc_t>;
  using Block = OpmathBlock<T>;
  const RowVectors<acc_t> v(k);
  RowSums<V> lanes{V(0), V(0), V(0)};
  int64_t i = 0;
  for (; i + Block::kSize <= n; i += Block::kSize) {
    const auto a = Block::load(x + i);
    const auto b = Block::load(y + i);
    for (int r = 0; r < Block::kRegisters; ++r) {
      const V s = a[r] * v.inv_t - v.lse_s;
      const V t = b[r] * v.inv_t - v.lse_t;
      add_terms<kMode, acc_t>(s, t, v.log_beta, v.log_1m_beta, lanes);
    }
  }
  RowSums<acc_t> sums{lane_sum(lanes.ks), lane_sum(lanes.kt), lane_sum(lanes.z)};
  for (; i < n; ++i) {
    const acc_t s = static_cast<acc_t>(x[i]) * k.inv_t - k.lse_s;
    const acc_t t = static_cast<acc_t>(y[i]) * k.inv_t - k.lse_t;
    add_terms<kMode, acc_t>(s, t, k.log_beta, k.log_1m_beta, sums);
  }
  return sums;
}

// The row's gradient with respect to the student's logits, `scale` holding
// grad_scale / T (times 1 - beta for the mixture) and `ks` the row's K_s
// (the loss for reverse KL).
template <typename T, JsdMode kMode>
void row_gradient(const T* x, const T* y, T* g, int64_t n,
                  const RowConstants<at::opmath_type<T>>& k, at::opmath_type<T> ks,
                  at::opmath_type<T> scale) {
  using acc_t = at::opmath_type<T>;
  using V = Vec<acc_t>;
  using Block = OpmathBlock<T>;
  const RowVectors<acc_t> v(k);
  const V vks(ks);
  const V vscale(scale);
  for_each_block<Block::kSize>(n, [&](int64_t i, int64_t count) {
    auto a = Block::load(x + i, count);
    const auto b = Block::load(y + i, count);
    for (int r = 0; r < Block::kRegisters; ++r) {
      const V s = a[r] * v.inv_t - v.lse_s;
      const V t = b[r] * v.inv_t - v.lse_t;
      const V p = activation_exp<acc_t>(s);
      V grad;
      if constexpr (kMode == JsdMode::ForwardKl) {
        grad = p - activation_exp<acc_t>(t);
      } else if constexpr (kMode == JsdMode::ReverseKl) {
        grad = weighted<acc_t>(p, s - t - vks);
      } else {
        const V m = log_mixture<acc_t>(t + v.log_beta, s + v.log_1m_beta);
        grad = weighted<acc_t>(p, s - m - vks);
      }
      a[r] = grad * vscale;
    }
    Block::store(g + i, a, count);
  });
}

template <typename T, JsdMode kMode>
void rows_impl(const detail::JsdRowsArgs& args) {
  using acc_t = at::opmath_type<T>;
  const int64_t vocab = args.student.size(1);
  const int64_t rows = args.student.size(0);
  const T* x_data = args.student.const_data_ptr<T>();
  const T* y_data = args.teacher.const_data_ptr<T>();
  T* g_data = args.grad.defined() ? args.grad.mutable_data_ptr<T>() : nullptr;
  const bool want_loss = args.loss.defined();
  acc_t* loss_data = want_loss ? args.loss.mutable_data_ptr<acc_t>() : nullptr;
  acc_t* stats_out = want_loss ? args.row_stats.mutable_data_ptr<acc_t>() : nullptr;
  const acc_t* stats_in = want_loss ? nullptr : args.row_stats.const_data_ptr<acc_t>();
  const acc_t* scale_data =
      args.grad_scale.defined() ? args.grad_scale.const_data_ptr<acc_t>() : nullptr;
  const int64_t scale_stride = args.grad_scale.defined() && args.grad_scale.dim() > 0 ? 1 : 0;
  const int64_t* label = args.label.defined() ? args.label.const_data_ptr<int64_t>() : nullptr;
  const int64_t ignore_index = args.options.ignore_index;
  const double beta = args.options.beta;
  const double inv_t = 1.0 / args.options.temperature;
  const bool mixture = kMode == JsdMode::Mixture;
  const RowConstants<acc_t> constants{static_cast<acc_t>(inv_t), 0, 0,
                                      mixture ? static_cast<acc_t>(std::log(beta)) : acc_t(0),
                                      mixture ? static_cast<acc_t>(std::log1p(-beta)) : acc_t(0)};
  [[maybe_unused]] const acc_t beta_acc = static_cast<acc_t>(beta);
  [[maybe_unused]] const acc_t one_m_beta = static_cast<acc_t>(1.0 - beta);
  const acc_t grad_factor = static_cast<acc_t>(mixture ? inv_t * (1.0 - beta) : inv_t);

  at::parallel_for(0, rows, row_grain(2 * vocab), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const T* x = x_data + row * vocab;
      const T* y = y_data + row * vocab;
      if (label != nullptr && label[row] == ignore_index) {
        if (want_loss) {
          loss_data[row] = 0;
          std::fill(stats_out + 3 * row, stats_out + 3 * row + 3, acc_t(0));
        }
        if (g_data != nullptr) {
          std::fill(g_data + row * vocab, g_data + (row + 1) * vocab, T(0));
        }
        continue;
      }
      RowConstants<acc_t> k = constants;
      acc_t ks;
      if (want_loss) {
        const auto [m_s, sum_s] = row_max_sum(x, vocab, ScaledLogit<acc_t>{k.inv_t});
        const auto [m_t, sum_t] = row_max_sum(y, vocab, ScaledLogit<acc_t>{k.inv_t});
        k.lse_s = m_s + std::log(sum_s);
        k.lse_t = m_t + std::log(sum_t);
        const auto [k_s, k_t, z] = row_divergence<T, kMode>(x, y, vocab, k);
        ks = z > acc_t(0) ? k_s / z : k_s;
        acc_t loss;
        if constexpr (kMode == JsdMode::ForwardKl) {
          loss = k_t;
        } else if constexpr (kMode == JsdMode::ReverseKl) {
          loss = k_s;
        } else {
          loss = beta_acc * k_t + one_m_beta * k_s;
        }
        loss_data[row] = loss;
        stats_out[3 * row] = k.lse_s;
        stats_out[3 * row + 1] = k.lse_t;
        stats_out[3 * row + 2] = ks;
      } else {
        k.lse_s = stats_in[3 * row];
        k.lse_t = stats_in[3 * row + 1];
        ks = stats_in[3 * row + 2];
      }
      if (g_data != nullptr) {
        row_gradient<T, kMode>(x, y, g_data + row * vocab, vocab, k, ks,
                               scale_data[row * scale_stride] * grad_factor);
      }
    }
  });
}

void jsd_rows_kernel_impl(const detail::JsdRowsArgs& args) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, args.student.scalar_type(),
                                  "fuseops::jsd", [&] {
                                    switch (detail::jsd_mode(args.options.beta)) {
                                      case JsdMode::ForwardKl:
                                        rows_impl<scalar_t, JsdMode::ForwardKl>(args);
                                        break;
                                      case JsdMode::ReverseKl:
                                        rows_impl<scalar_t, JsdMode::ReverseKl>(args);
                                        break;
                                      case JsdMode::Mixture:
                                        rows_impl<scalar_t, JsdMode::Mixture>(args);
                                        break;
                                    }
                                  });
}

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(JsdCpuKernels::rows, &jsd_rows_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
