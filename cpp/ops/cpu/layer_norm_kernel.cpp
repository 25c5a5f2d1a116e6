// layer_norm CPU kernels; compiled once per CPU capability
// (FuseopsCpuKernels.cmake).
//
// Rows are processed in parallel, one row at a time per thread. A row is
// small enough to stay in L1/L2 while it is worked on, so the statistics take
// one or two passes over it (see row_statistics) and memory sees each input
// once.
// bfloat16/float16 rows are widened to a float32 scratch row first; all
// arithmetic is in float32 (float64 for float64 input).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "ops/cpu/elementwise.h"
#include "ops_generated/cpu/layer_norm.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

using at::vec::Vectorized;

template <typename T>
inline constexpr bool kIsReduced = std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>;

// dst[0:n] = src[0:n], widened to float.
template <typename T>
void widen(const T* src, float* dst, int64_t n) {
  using bVec = Vectorized<T>;
  using fVec = Vectorized<float>;
  int64_t i = 0;
  for (; i + bVec::size() <= n; i += bVec::size()) {
    auto [lo, hi] = at::vec::convert_to_float<T>(bVec::loadu(src + i));
    lo.store(dst + i);
    hi.store(dst + i + fVec::size());
  }
  for (; i < n; ++i) {
    dst[i] = static_cast<float>(src[i]);
  }
}

// The row as acc_t values: the row itself, or its widened copy in `scratch`.
template <typename T, typename acc_t>
const acc_t* row_in_acc(const T* row, acc_t* scratch, int64_t n) {
  if constexpr (kIsReduced<T>) {
    widen(row, scratch, n);
    return scratch;
  } else {
    return row;
  }
}

// Stores n values, each `value(i)` (a Vectorized<acc_t> of elements
// i .. i + Vectorized<acc_t>::size()), or `scalar(i)` for the tail, narrowing
// to T where T is a reduced type.
template <typename T, typename VecFn, typename ScalarFn>
void store_row(T* dst, int64_t n, const VecFn& value, const ScalarFn& scalar) {
  using acc_t = at::opmath_type<T>;
  using aVec = Vectorized<acc_t>;
  int64_t i = 0;
  if constexpr (kIsReduced<T>) {
    using bVec = Vectorized<T>;
    for (; i + bVec::size() <= n; i += bVec::size()) {
      narrow_from_float<T>(value(i), value(i + aVec::size())).store(dst + i);
    }
  } else {
    for (; i + aVec::size() <= n; i += aVec::size()) {
      value(i).store(dst + i);
    }
  }
  for (; i < n; ++i) {
    dst[i] = static_cast<T>(scalar(i));
  }
}

// Sum of a vector's lanes. (at::vec::vec_reduce_all's AVX-512 shuffles trip
// GCC's -Wuninitialized inside the intrinsics headers; once per row, a
// store and a scalar loop cost nothing.)
template <typename acc_t>
acc_t reduce_add(const Vectorized<acc_t>& v) {
  alignas(64) acc_t lanes[Vectorized<acc_t>::size()];
  v.store(lanes);
  acc_t sum = 0;
  for (acc_t lane : lanes) {
    sum += lane;
  }
  return sum;
}

// Sums of d and d * d over the row, d = x - center, four accumulators wide.
template <typename acc_t>
std::pair<acc_t, acc_t> deviation_sums(const acc_t* x, int64_t n, acc_t center) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t kWidth = Vec::size();
  const Vec c(center);
  Vec s0(0), s1(0), q0(0), q1(0);
  int64_t i = 0;
  for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
    const Vec d0 = Vec::loadu(x + i) - c;
    const Vec d1 = Vec::loadu(x + i + kWidth) - c;
    s0 += d0;
    s1 += d1;
    q0 = at::vec::fmadd(d0, d0, q0);
    q1 = at::vec::fmadd(d1, d1, q1);
  }
  for (; i + kWidth <= n; i += kWidth) {
    const Vec d = Vec::loadu(x + i) - c;
    s0 += d;
    q0 = at::vec::fmadd(d, d, q0);
  }
  acc_t sum = reduce_add(s0 + s1);
  acc_t sum_sq = reduce_add(q0 + q1);
  for (; i < n; ++i) {
    const acc_t d = x[i] - center;
    sum += d;
    sum_sq += d * d;
  }
  return {sum, sum_sq};
}

// deviation_sums of a bfloat16/float16 row, widening it into `dst` in the
// same pass (the later passes read the float copy).
template <typename T>
std::pair<float, float> widen_and_sum_deviations(const T* src, float* dst, int64_t n,
                                                 float center) {
  using bVec = Vectorized<T>;
  using fVec = Vectorized<float>;
  const fVec c(center);
  fVec s0(0), s1(0), q0(0), q1(0);
  int64_t i = 0;
  for (; i + bVec::size() <= n; i += bVec::size()) {
    auto [lo, hi] = at::vec::convert_to_float<T>(bVec::loadu(src + i));
    lo.store(dst + i);
    hi.store(dst + i + fVec::size());
    const fVec d0 = lo - c;
    const fVec d1 = hi - c;
    s0 += d0;
    s1 += d1;
    q0 = at::vec::fmadd(d0, d0, q0);
    q1 = at::vec::fmadd(d1, d1, q1);
  }
  float sum = reduce_add(s0 + s1);
  float sum_sq = reduce_add(q0 + q1);
  for (; i < n; ++i) {
    dst[i] = static_cast<float>(src[i]);
    const float d = dst[i] - center;
    sum += d;
    sum_sq += d * d;
  }
  return {sum, sum_sq};
}

// Mean and 1 / sqrt(variance + eps) of a row from the sums of d = x - c
// and d^2 around a center c: mean = c + sum(d) / n and variance =
// (sum(d^2) - sum(d)^2 / n) / n (the shifted-data / corrected two-pass
// formulas, Chan, Golub & LeVeque). The first pass takes c = x[0]: one pass
// over the row, and exact for a constant row (every d is 0, so it
// normalises to exactly 0 even with BERT's eps = 1e-12; a plain float32
// mean of 4096 copies of 3.3 is not 3.3 and left |y| ~ 0.9). The
// subtraction in the variance has a relative error of about
// (1 + k^2) * float eps when c lies k standard deviations from the mean: for
// k > 3 (0.3% of Gaussian rows) a second pass centres on the mean found.
// Rows whose squared deviations overflow (|x| ~ 1e20 and up in float32) are
// measured again in units of their largest deviation.
// `first` holds the sums around x[0].
template <typename acc_t>
std::pair<acc_t, acc_t> row_statistics(const acc_t* x, int64_t n, double eps,
                                       std::pair<acc_t, acc_t> first) {
  const acc_t count = static_cast<acc_t>(n);
  acc_t center = x[0];
  auto [sum, sum_sq] = first;
  acc_t mean = center + sum / count;
  const acc_t offset_sq = sum * sum / count;  // n (mean - center)^2
  // Written so that NaN or Inf sums take the second pass too.
  if (!(offset_sq <= acc_t(9) * (sum_sq - offset_sq))) {
    center = mean;
    std::tie(sum, sum_sq) = deviation_sums(x, n, center);
    mean = center + sum / count;
  }
  acc_t scale = 1;
  if (std::isinf(sum_sq) && std::isfinite(center)) {
    // Rare: a scalar pass with double sums of the scaled deviations (<= 1).
    scale = 0;
    for (int64_t i = 0; i < n; ++i) {
      scale = std::max(scale, std::abs(x[i] - mean));
    }
    double scaled_sum = 0;
    double scaled_sum_sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = static_cast<double>((x[i] - mean) / scale);
      scaled_sum += d;
      scaled_sum_sq += d * d;
    }
    sum = static_cast<acc_t>(scaled_sum);
    sum_sq = static_cast<acc_t>(scaled_sum_sq);
  }
  const acc_t variance = std::max(acc_t(0), (sum_sq - sum * sum / count) / count);
  // 1 / (scale * sqrt(variance + eps / scale^2)) is 1 / sqrt(scale^2 *
  // variance + eps) without forming scale^2 * variance.
  const acc_t rstd =
      acc_t(1) / (scale * std::sqrt(variance + static_cast<acc_t>(eps) / (scale * scale)));
  return {mean, rstd};
}

// Per-thread [H] rows of weight and bias as acc_t: the parameter itself when
// it already is acc_t, else a widened copy, or ones / zeros when absent (an
// exact identity in the fused multiply-add).
template <typename T>
class AffineRow {
 public:
  using acc_t = at::opmath_type<T>;

  AffineRow(const at::Tensor& param, int64_t hidden, acc_t absent_value) {
    if (!param.defined()) {
      storage_.assign(hidden, absent_value);
      data_ = storage_.data();
    } else if constexpr (kIsReduced<T>) {
      storage_.resize(hidden);
      widen(param.const_data_ptr<T>(), storage_.data(), hidden);
      data_ = storage_.data();
    } else {
      data_ = param.const_data_ptr<T>();
    }
  }

  const acc_t* data() const { return data_; }

 private:
  std::vector<acc_t> storage_;
  const acc_t* data_ = nullptr;
};

template <typename T>
void layer_norm_forward_impl(const at::Tensor& out, const at::Tensor& mean, const at::Tensor& rstd,
                             const at::Tensor& input, const at::Tensor& weight,
                             const at::Tensor& bias, double eps) {
  using acc_t = at::opmath_type<T>;
  using Vec = Vectorized<acc_t>;
  const int64_t hidden = input.size(-1);
  const int64_t rows = input.numel() / hidden;
  const T* x_data = input.const_data_ptr<T>();
  T* y_data = out.mutable_data_ptr<T>();
  acc_t* mean_data = mean.defined() ? mean.mutable_data_ptr<acc_t>() : nullptr;
  acc_t* rstd_data = rstd.defined() ? rstd.mutable_data_ptr<acc_t>() : nullptr;
  at::parallel_for(0, rows, row_grain(hidden), [&](int64_t begin, int64_t end) {
    const AffineRow<T> w(weight, hidden, acc_t(1));
    const AffineRow<T> b(bias, hidden, acc_t(0));
    std::vector<acc_t> scratch(kIsReduced<T> ? hidden : 0);
    for (int64_t row = begin; row < end; ++row) {
      // The first statistics pass widens a bfloat16/float16 row as it goes.
      const T* src = x_data + row * hidden;
      const acc_t* x;
      std::pair<acc_t, acc_t> first;
      if constexpr (kIsReduced<T>) {
        first = widen_and_sum_deviations(src, scratch.data(), hidden, static_cast<acc_t>(src[0]));
        x = scratch.data();
      } else {
        first = deviation_sums(src, hidden, src[0]);
        x = src;
      }
      const auto [row_mean, row_rstd] = row_statistics(x, hidden, eps, first);
      if (mean_data != nullptr) {
        mean_data[row] = row_mean;
        rstd_data[row] = row_rstd;
      }
      // (x - mean) * rstd rather than fma(x, rstd, -mean * rstd): the rounding
      // of mean * rstd would dominate rows of tiny variance (large rstd).
      const Vec vmean(row_mean);
      const Vec vrstd(row_rstd);
      const acc_t* wp = w.data();
      const acc_t* bp = b.data();
      store_row(
          y_data + row * hidden, hidden,
          [&](int64_t i) {
            return at::vec::fmadd((Vec::loadu(x + i) - vmean) * vrstd, Vec::loadu(wp + i),
                                  Vec::loadu(bp + i));
          },
          [&](int64_t i) { return (x[i] - row_mean) * row_rstd * wp[i] + bp[i]; });
    }
  });
}

void layer_norm_kernel_impl(const at::Tensor& out, const at::Tensor& mean, const at::Tensor& rstd,
                            const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, double eps) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::layer_norm",
      [&] { layer_norm_forward_impl<scalar_t>(out, mean, rstd, input, weight, bias, eps); });
}

// With x_hat = (x - mean) * rstd and g = grad_output * w:
//   grad_input  = rstd * (g - mean(g) - x_hat * mean(g * x_hat))
//   grad_weight = sum over rows of grad_output * x_hat
//   grad_bias   = sum over rows of grad_output
// The rows are split into one block per thread. Each block walks its rows
// once, writing grad_input and adding into its own float32 (float64) [2, H]
// partial sums of grad_weight and grad_bias; a final pass over H adds the
// blocks' partials. Every input element is read from memory once.
template <typename T>
void layer_norm_backward_impl(const at::Tensor& grad_input, const at::Tensor& grad_weight,
                              const at::Tensor& grad_bias, const at::Tensor& grad_output,
                              const at::Tensor& input, const at::Tensor& weight,
                              const at::Tensor& mean, const at::Tensor& rstd) {
  using acc_t = at::opmath_type<T>;
  using Vec = Vectorized<acc_t>;
  const int64_t hidden = input.size(-1);
  const int64_t rows = input.numel() / hidden;
  const T* x_data = input.const_data_ptr<T>();
  const T* dy_data = grad_output.const_data_ptr<T>();
  T* dx_data = grad_input.mutable_data_ptr<T>();
  const acc_t* mean_data = mean.const_data_ptr<acc_t>();
  const acc_t* rstd_data = rstd.const_data_ptr<acc_t>();

  const int64_t blocks = row_sum_blocks(rows, hidden);
  std::vector<acc_t> partials(static_cast<size_t>(blocks) * 2 * hidden);

  at::parallel_for(0, blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    const AffineRow<T> w(weight, hidden, acc_t(1));
    const acc_t* wp = w.data();
    std::vector<acc_t> x_scratch(kIsReduced<T> ? hidden : 0);
    std::vector<acc_t> dy_scratch(kIsReduced<T> ? hidden : 0);
    for (int64_t block = block_begin; block < block_end; ++block) {
      acc_t* dw = partials.data() + block * 2 * hidden;
      acc_t* db = dw + hidden;
      std::fill(dw, dw + 2 * hidden, acc_t(0));
      const int64_t row_begin = rows * block / blocks;
      const int64_t row_end = rows * (block + 1) / blocks;
      for (int64_t row = row_begin; row < row_end; ++row) {
        const acc_t* x = row_in_acc(x_data + row * hidden, x_scratch.data(), hidden);
        const acc_t* dy = row_in_acc(dy_data + row * hidden, dy_scratch.data(), hidden);
        const acc_t row_mean = mean_data[row];
        const acc_t row_rstd = rstd_data[row];
        const Vec vmean(row_mean);
        const Vec vrstd(row_rstd);

        // Pass 1: the row sums of g and g * x_hat, and the partial sums of
        // the parameter gradients.
        Vec sum_g(0), sum_gx(0);
        int64_t i = 0;
        for (; i + Vec::size() <= hidden; i += Vec::size()) {
          const Vec x_hat = (Vec::loadu(x + i) - vmean) * vrstd;
          const Vec dyv = Vec::loadu(dy + i);
          const Vec g = dyv * Vec::loadu(wp + i);
          sum_g += g;
          sum_gx = at::vec::fmadd(g, x_hat, sum_gx);
          at::vec::fmadd(dyv, x_hat, Vec::loadu(dw + i)).store(dw + i);
          (Vec::loadu(db + i) + dyv).store(db + i);
        }
        acc_t row_sum_g = reduce_add(sum_g);
        acc_t row_sum_gx = reduce_add(sum_gx);
        for (; i < hidden; ++i) {
          const acc_t x_hat = (x[i] - row_mean) * row_rstd;
          const acc_t g = dy[i] * wp[i];
          row_sum_g += g;
          row_sum_gx += g * x_hat;
          dw[i] += dy[i] * x_hat;
          db[i] += dy[i];
        }

        // Pass 2: grad_input = (g - mean_g - x_hat * mean_gx) * rstd, the
        // bracket first: it is small where rstd is large (rows of tiny
        // variance), and exactly zero for rows of one element.
        const acc_t mean_g = row_sum_g / static_cast<acc_t>(hidden);
        const acc_t mean_gx = row_sum_gx / static_cast<acc_t>(hidden);
        const Vec vmean_g(mean_g);
        const Vec vmean_gx(mean_gx);
        store_row(
            dx_data + row * hidden, hidden,
            [&](int64_t j) {
              const Vec x_hat = (Vec::loadu(x + j) - vmean) * vrstd;
              const Vec g = Vec::loadu(dy + j) * Vec::loadu(wp + j);
              return (g - vmean_g - x_hat * vmean_gx) * vrstd;
            },
            [&](int64_t j) {
              const acc_t x_hat = (x[j] - row_mean) * row_rstd;
              return (dy[j] * wp[j] - mean_g - x_hat * mean_gx) * row_rstd;
            });
      }
    }
  });

  // Add the blocks' partials, column by column.
  T* dw_out = grad_weight.mutable_data_ptr<T>();
  T* db_out = grad_bias.mutable_data_ptr<T>();
  at::parallel_for(0, hidden, kRowGrain, [&](int64_t begin, int64_t end) {
    const int64_t n = end - begin;
    auto column_sum = [&](int64_t offset) {
      // Sum over blocks of partials[block][offset + j] for j in [begin, end).
      return [&, offset](int64_t j) {
        Vec sum = Vec::loadu(partials.data() + offset + begin + j);
        for (int64_t block = 1; block < blocks; ++block) {
          sum += Vec::loadu(partials.data() + block * 2 * hidden + offset + begin + j);
        }
        return sum;
      };
    };
    auto column_sum_scalar = [&](int64_t offset) {
      return [&, offset](int64_t j) {
        acc_t sum = 0;
        for (int64_t block = 0; block < blocks; ++block) {
          sum += partials[block * 2 * hidden + offset + begin + j];
        }
        return sum;
      };
    };
    store_row(dw_out + begin, n, column_sum(0), column_sum_scalar(0));
    store_row(db_out + begin, n, column_sum(hidden), column_sum_scalar(hidden));
  });
}

void layer_norm_backward_kernel_impl(const at::Tensor& grad_input, const at::Tensor& grad_weight,
                                     const at::Tensor& grad_bias, const at::Tensor& grad_output,
                                     const at::Tensor& input, const at::Tensor& weight,
                                     const at::Tensor& mean, const at::Tensor& rstd) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::layer_norm_backward", [&] {
        layer_norm_backward_impl<scalar_t>(grad_input, grad_weight, grad_bias, grad_output, input,
                                           weight, mean, rstd);
      });
}

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(LayerNormCpuKernels::forward, &layer_norm_kernel_impl);
FUSEOPS_REGISTER_CPU_KERNEL(LayerNormCpuKernels::backward, &layer_norm_backward_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
