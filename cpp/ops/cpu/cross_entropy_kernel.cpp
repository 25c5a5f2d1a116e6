// cross_entropy CPU kernels; compiled once per CPU capability
// (FuseopsCpuKernels.cmake).
//
// Rows are processed in parallel, one row at a time per thread. The forward
// reads a row once for its statistics: a running maximum and a running sum of
// exp(z - max) per vector lane (online softmax; the sum is rescaled once per
// step of several vectors, not per element), combined across lanes at the end.
// The gradient is a second pass over the same row (still in L2 at vocabulary
// sizes: 32000 float32 are 125 KiB) that reads and writes each element once;
// the backward op is that pass alone, from the saved logsumexp. All
// arithmetic is in float32 (float64 for float64); the target's term
// p_t * A - (1 - s) w_t is formed in float32 before it is rounded, since p_t - 1
// loses everything when p_t is rounded to bfloat16 first.

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
#include "ops_generated/cpu/cross_entropy.h"
#include "ops/cpu/row_max_sum.h"
#include "ops/cpu/elementwise.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

void cross_entropy_target_kernel_impl(const detail::CrossEntropyTargetArgs& args) {
  const int64_t* target = args.target.const_data_ptr<int64_t>();
  const int64_t rows = args.target.numel();
  AT_DISPATCH_FLOATING_TYPES(args.row_weight.scalar_type(), "fuseops::cross_entropy", [&] {
    scalar_t* row_weight = args.row_weight.mutable_data_ptr<scalar_t>();
    const scalar_t* weight =
        args.weight.defined() ? args.weight.const_data_ptr<scalar_t>() : nullptr;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t t = target[i];
      if (t == args.ignore_index) {
        row_weight[i] = 0;
        continue;
      }
      TORCH_CHECK(t >= 0 && t < args.vocab, args.op, ": argument 'target' holds ", t,
                  " at position ", i, ", outside the classes [0, ", args.vocab,
                  ") and not ignore_index (", args.ignore_index, ")");
      row_weight[i] = weight != nullptr ? weight[t] : scalar_t(1);
    }
  });
}

// A row's logits as cross_entropy sees them: z = cap * tanh(x / cap) with a
// softcap, else x.
template <bool kSoftcap, typename acc_t>
struct CappedLogit {
  acc_t cap;
  acc_t inv_cap;
  C10_ALWAYS_INLINE Vec<acc_t> operator()(const Vec<acc_t>& x) const {
    if constexpr (kSoftcap) {
      return Vec<acc_t>(cap) * (x * Vec<acc_t>(inv_cap)).tanh();
    } else {
      return x;
    }
  }
  C10_ALWAYS_INLINE acc_t operator()(acc_t x) const {
    if constexpr (kSoftcap) {
      return cap * std::tanh(x * inv_cap);
    } else {
      return x;
    }
  }
};

// sum_c w_c z_c over the row (w = 1 when `weight` is null): label smoothing's
// term, a second read of a row still in cache.
template <typename T, bool kSoftcap>
at::opmath_type<T> row_weighted_sum(const T* x, const at::opmath_type<T>* weight, int64_t n,
                                    const CappedLogit<kSoftcap, at::opmath_type<T>>& logit) {
  using acc_t = at::opmath_type<T>;
  using V = Vec<acc_t>;
  using Block = OpmathBlock<T>;
  V sum_v(0);
  int64_t i = 0;
  for (; i + Block::kSize <= n; i += Block::kSize) {
    const auto a = Block::load(x + i);
    for (int r = 0; r < Block::kRegisters; ++r) {
      const V z = logit(a[r]);
      sum_v = weight != nullptr ? at::vec::fmadd(z, V::loadu(weight + i + r * V::size()), sum_v)
                                : sum_v + z;
    }
  }
  alignas(64) acc_t lanes[V::size()];
  sum_v.store(lanes);
  acc_t sum = 0;
  for (acc_t lane : lanes) {
    sum += lane;
  }
  for (; i < n; ++i) {
    const acc_t z = logit(static_cast<acc_t>(x[i]));
    sum += weight != nullptr ? weight[i] * z : z;
  }
  return sum;
}

// g_c = (exp(z_c - lse) * a - b_c) * dz_c/dx_c over the row, with
// b_c = b * weight_c (b where weight is null), dz/dx = 1 - (z / cap)^2 under
// a softcap; `a` and `b` already carry the row's gradient scale. `g` may be
// `x` itself: each block is read before it is written.
template <typename T, bool kSoftcap, bool kWeighted>
void row_gradient(const T* x, T* g, const at::opmath_type<T>* weight, int64_t n,
                  at::opmath_type<T> lse, at::opmath_type<T> a, at::opmath_type<T> b,
                  const CappedLogit<kSoftcap, at::opmath_type<T>>& logit) {
  using acc_t = at::opmath_type<T>;
  using V = Vec<acc_t>;
  using Block = OpmathBlock<T>;
  const V vinv(logit.inv_cap);
  const V vlse(lse);
  const V va(a);
  const V vb(b);
  for_each_block<Block::kSize>(n, [&](int64_t i, int64_t count) {
    auto v = Block::load(x + i, count);
    for (int r = 0; r < Block::kRegisters; ++r) {
      const V z = logit(v[r]);
      V bc = vb;
      if constexpr (kWeighted) {
        const int64_t offset = r * V::size();
        const int64_t lanes = std::clamp<int64_t>(count - offset, 0, V::size());
        bc = vb * V::loadu(weight + i + offset, lanes);
      }
      V grad = at::vec::fmsub(activation_exp<acc_t>(z - vlse), va, bc);
      if constexpr (kSoftcap) {
        const V u = z * vinv;
        grad = grad * (V(1) - u * u);
      }
      v[r] = grad;
    }
    Block::store(g + i, v, count);
  });
}

template <typename T, bool kSoftcap>
void rows_impl(const detail::CrossEntropyRowsArgs& args) {
  using acc_t = at::opmath_type<T>;
  const int64_t vocab = args.logits.size(1);
  const int64_t rows = args.logits.size(0);
  const T* x_data = args.logits.const_data_ptr<T>();
  T* g_data = args.grad.defined() ? args.grad.mutable_data_ptr<T>() : nullptr;
  const bool want_loss = args.loss.defined();
  acc_t* loss_data = want_loss ? args.loss.mutable_data_ptr<acc_t>() : nullptr;
  acc_t* lse_data = want_loss ? args.lse.mutable_data_ptr<acc_t>() : nullptr;
  const acc_t* saved_lse = want_loss ? nullptr : args.lse.const_data_ptr<acc_t>();
  const acc_t* scale_data =
      args.grad_scale.defined() ? args.grad_scale.const_data_ptr<acc_t>() : nullptr;
  const int64_t scale_stride = args.grad_scale.defined() && args.grad_scale.dim() > 0 ? 1 : 0;
  const int64_t* target = args.target.const_data_ptr<int64_t>();
  const acc_t* row_weight = args.row_weight.const_data_ptr<acc_t>();
  const acc_t* weight = args.weight.defined() ? args.weight.const_data_ptr<acc_t>() : nullptr;
  const acc_t weight_sum =
      weight != nullptr ? args.weight_sum.const_data_ptr<acc_t>()[0] : static_cast<acc_t>(vocab);
  const acc_t smoothing = static_cast<acc_t>(args.options.label_smoothing);
  const acc_t z_loss = static_cast<acc_t>(args.options.z_loss);
  const acc_t cap = kSoftcap ? static_cast<acc_t>(args.options.softcap) : acc_t(1);
  const CappedLogit<kSoftcap, acc_t> logit{cap, acc_t(1) / cap};
  const acc_t smooth_per_class = smoothing / static_cast<acc_t>(vocab);
  const bool weighted_smoothing = weight != nullptr && smoothing > 0;

  at::parallel_for(0, rows, row_grain(vocab), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const T* x = x_data + row * vocab;
      const int64_t t = target[row];
      if (t == args.options.ignore_index) {
        if (want_loss) {
          loss_data[row] = 0;
          lse_data[row] = 0;
        }
        if (g_data != nullptr) {
          std::fill(g_data + row * vocab, g_data + (row + 1) * vocab, T(0));
        }
        continue;
      }
      const acc_t w_t = row_weight[row];
      // Read before the gradient may overwrite the row.
      const acc_t z_t = logit(static_cast<acc_t>(x[t]));
      acc_t lse;
      if (want_loss) {
        const auto [m, s] = row_max_sum(x, vocab, logit);
        lse = m + std::log(s);
        acc_t loss = (acc_t(1) - smoothing) * w_t * (lse - z_t) + z_loss * lse * lse;
        if (smoothing > 0) {
          const acc_t zsum = row_weighted_sum<T, kSoftcap>(x, weight, vocab, logit);
          loss += smooth_per_class * (weight_sum * lse - zsum);
        }
        loss_data[row] = loss;
        lse_data[row] = lse;
      } else {
        lse = saved_lse[row];
      }
      if (g_data == nullptr) {
        continue;
      }
      const acc_t scale = scale_data[row * scale_stride];
      const acc_t a =
          (acc_t(1) - smoothing) * w_t + smooth_per_class * weight_sum + acc_t(2) * z_loss * lse;
      T* g = g_data + row * vocab;
      if (weighted_smoothing) {
        row_gradient<T, kSoftcap, true>(x, g, weight, vocab, lse, a * scale,
                                        smooth_per_class * scale, logit);
      } else {
        row_gradient<T, kSoftcap, false>(x, g, weight, vocab, lse, a * scale,
                                         smooth_per_class * scale, logit);
      }
      // The target's element in float32: p_t * a - b_t - (1 - s) w_t.
      const acc_t b_t = weight != nullptr ? smooth_per_class * weight[t] : smooth_per_class;
      acc_t g_t = std::exp(z_t - lse) * a - b_t - (acc_t(1) - smoothing) * w_t;
      if constexpr (kSoftcap) {
        const acc_t u = z_t * logit.inv_cap;
        g_t *= acc_t(1) - u * u;
      }
      g[t] = static_cast<T>(g_t * scale);
    }
  });
}

void cross_entropy_rows_kernel_impl(const detail::CrossEntropyRowsArgs& args) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, args.logits.scalar_type(),
                                  "fuseops::cross_entropy", [&] {
                                    if (args.options.softcap > 0) {
                                      rows_impl<scalar_t, true>(args);
                                    } else {
                                      rows_impl<scalar_t, false>(args);
                                    }
                                  });
}

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(CrossEntropyCpuKernels::target, &cross_entropy_target_kernel_impl);
FUSEOPS_REGISTER_CPU_KERNEL(CrossEntropyCpuKernels::rows, &cross_entropy_rows_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
