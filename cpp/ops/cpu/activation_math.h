#pragma once
// Vectorized GELU/SiLU math and float32-through loads/stores, for kernel
// files compiled per CPU capability. The results (NaN/Inf included) are those
// of ATen's CPU kernels (aten/src/ATen/native/cpu/Activation.cpp) to float32
// rounding; the float32 exp is inlined here for speed and GELU-tanh goes
// through a sigmoid (see activation_value). bfloat16/float16 are computed in
// float32, float64 in double.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "ops/activation.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {

using detail::Activation;

template <typename T>
using Vec = at::vec::Vectorized<T>;

// The vector math and the block loads/stores below are C10_ALWAYS_INLINE:
// in the kernels' many dispatch instantiations GCC otherwise kept them as
// out-of-line calls, one per vector, passing registers through memory
// (measured: silu on 2M floats 3.1 ms with the calls, 1.9 ms inlined).

// Loads and stores the opmath registers (float for bfloat16/float16,
// float32 and float64 as themselves) from/to `count` consecutive scalar_t;
// lanes past `count` read as zeros and are not written.
template <typename scalar_t>
struct OpmathBlock {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = at::vec::Vectorized<opmath_t>;
  using ScalarVec = at::vec::Vectorized<scalar_t>;
  static constexpr bool kReduced = !std::is_same_v<scalar_t, opmath_t>;
  // One Vectorized<scalar_t> of a reduced type holds two opmath registers.
  static constexpr int kRegisters = kReduced ? 2 : 1;
  using Registers = std::array<Vec, kRegisters>;
  static constexpr int64_t kSize = ScalarVec::size();

  C10_ALWAYS_INLINE static Registers load(const scalar_t* p, int64_t count = kSize) {
    const ScalarVec raw = count == kSize ? ScalarVec::loadu(p) : ScalarVec::loadu(p, count);
    if constexpr (kReduced) {
      const auto [lo, hi] = at::vec::convert_to_float<scalar_t>(raw);
      return {lo, hi};
    } else {
      return {raw};
    }
  }

  C10_ALWAYS_INLINE static void store(scalar_t* p, const Registers& v, int64_t count = kSize) {
    if constexpr (kReduced) {
      at::vec::convert_from_float<scalar_t>(v[0], v[1]).store(p, count);
    } else {
      v[0].store(p, count);
    }
  }
};

// Calls fn(offset, count) for consecutive blocks covering [0, n): full
// blocks, then one partial block for the tail.
template <int64_t kBlock, typename Fn>
inline void for_each_block(int64_t n, const Fn& fn) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    fn(i, kBlock);
  }
  if (i < n) {
    fn(i, n - i);
  }
}

// Calls fn(row, col_begin, col_end) for the parts of rows x cols (row-major)
// each parallel task owns; tasks split the flat range, so short rows are
// batched and long rows are shared.
template <typename Fn>
inline void parallel_rows(int64_t rows, int64_t cols, int64_t grain, const Fn& fn) {
  at::parallel_for(0, rows * cols, grain, [&](int64_t begin, int64_t end) {
    int64_t row = begin / cols;
    int64_t col = begin % cols;
    while (begin < end) {
      const int64_t stop = std::min(cols, col + (end - begin));
      fn(row, col, stop);
      begin += stop - col;
      ++row;
      col = 0;
    }
  });
}

template <typename T>
struct GeluConstants {
  static constexpr T kAlpha = T(M_SQRT1_2);                      // 1/sqrt(2)
  static constexpr T kBeta = T(M_2_SQRTPI * M_SQRT1_2 * 0.5);    // 1/sqrt(2*pi)
  static constexpr T kTanhBeta = T(M_SQRT2 * M_2_SQRTPI * 0.5);  // sqrt(2/pi)
  static constexpr T kKappa = T(0.044715);
};

// exp(x). float32 uses an inlined Cephes-style exp: n = round(x / ln 2),
// r = x - n ln 2 (ln 2 in two parts), e^r by a degree-5 polynomial (~1 ulp),
// and n added straight into the exponent bits. That is 18 vector operations
// and no call, about twice as fast as at::vec's exp() (a Sleef call) on
// AVX2, and the activations are bound by their operation count. Range: to
// float32 rounding for x in [-87, ln(FLT_MAX)]; +Inf above; 0 below -87,
// where e^x < 1.7e-38 (results near FLT_MIN are flushed, so that, as with
// std::exp, exp(-Inf) * Inf is NaN in a derivative); NaN stays NaN (its
// bits keep a NaN exponent). float64 keeps at::vec's exp.
template <typename T>
C10_ALWAYS_INLINE Vec<T> activation_exp(const Vec<T>& x) {
  using V = Vec<T>;
  if constexpr (!std::is_same_v<T, float>) {
    return x.exp();
  } else {
    const V max_x(88.72283935546875f);  // ln(FLT_MAX)
    const V min_x(-87.0f);
    const V n = (x * V(1.44269504088896341f)).round();
    V r = at::vec::fmadd(n, V(-0.693359375f), x);  // n * 0.693359375 is exact
    r = at::vec::fmadd(n, V(2.12194440e-4f), r);
    V p(1.9875691500e-4f);
    p = at::vec::fmadd(p, r, V(1.3981999507e-3f));
    p = at::vec::fmadd(p, r, V(8.3334519073e-3f));
    p = at::vec::fmadd(p, r, V(4.1665795894e-2f));
    p = at::vec::fmadd(p, r, V(1.6666665459e-1f));
    p = at::vec::fmadd(p, r, V(5.0000001201e-1f));
    const V exp_r = at::vec::fmadd(p, r * r, r + V(1.0f));
    // e^r * 2^n: add n << 23 (computed exactly in float as n * 2^23) to the
    // bits. In range the result is a normal float (n = 128 only with
    // e^r <= 1); outside it the lanes are replaced below.
    const V y = at::vec::cast<float>(at::vec::cast<int32_t>(exp_r) +
                                     at::vec::convert<int32_t>(n * V(8388608.0f)));
    return V::blendv(V::blendv(y, V(std::numeric_limits<float>::infinity()), x > max_x),
                     V(0.0f), x < min_x);
  }
}

// 1 / (1 + exp(-x)).
template <typename T>
C10_ALWAYS_INLINE Vec<T> activation_sigmoid(const Vec<T>& x) {
  using V = Vec<T>;
  return V(T(1)) / (V(T(1)) + activation_exp(x.neg()));
}

// erf(x) by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), the formula of
// at::vec's float erf, with activation_exp; float64 keeps at::vec's erf.
template <typename T>
C10_ALWAYS_INLINE Vec<T> activation_erf(const Vec<T>& x) {
  using V = Vec<T>;
  if constexpr (!std::is_same_v<T, float>) {
    return x.erf();
  } else {
    const auto one = V(1.0f);
    const auto t = one / at::vec::fmadd(V(0.3275911f), x.abs(), one);
    auto r = at::vec::fmadd(V(1.061405429f), t, V(-1.453152027f));
    r = at::vec::fmadd(r, t, V(1.421413741f));
    r = at::vec::fmadd(r, t, V(-0.284496736f));
    r = at::vec::fmadd(r, t, V(0.254829592f));
    const auto magnitude = one - r * t * activation_exp((x * x).neg());
    // Give the magnitude x's sign (NaN stays NaN).
    return magnitude ^ (x & V(-0.0f));
  }
}

// Activation value f(x). GELU-tanh is written with the identity
// 0.5 * (1 + tanh(u)) = sigmoid(2u): one exp instead of a tanh, and no
// cancellation in 1 + tanh(u) for negative x. For x = -Inf it gives NaN
// (-Inf * 0), as ATen's formula does.
template <Activation kAct, typename T>
C10_ALWAYS_INLINE Vec<T> activation_value(const Vec<T>& x) {
  using V = Vec<T>;
  using C = GeluConstants<T>;
  if constexpr (kAct == Activation::Silu) {
    return x * activation_sigmoid(x);
  } else if constexpr (kAct == Activation::GeluErf) {
    return x * V(T(0.5)) * (V(T(1)) + activation_erf(x * V(C::kAlpha)));
  } else {
    const auto inner = V(C::kTanhBeta) * (x + V(C::kKappa) * (x * x * x));
    return x * activation_sigmoid(inner + inner);
  }
}

// Derivative f'(x); with kWantValue also f(x), sharing the transcendental.
template <Activation kAct, bool kWantValue, typename T>
C10_ALWAYS_INLINE Vec<T> activation_derivative(const Vec<T>& x,
                                               std::type_identity_t<Vec<T>>* value) {
  using V = Vec<T>;
  using C = GeluConstants<T>;
  const auto one = V(T(1));
  const auto half = V(T(0.5));
  if constexpr (kAct == Activation::Silu) {
    const auto sigmoid = activation_sigmoid(x);
    if constexpr (kWantValue) {
      *value = x * sigmoid;
    }
    return sigmoid * (one + x * (one - sigmoid));
  } else if constexpr (kAct == Activation::GeluErf) {
    const auto cdf = half * (one + activation_erf(x * V(C::kAlpha)));
    const auto pdf = V(C::kBeta) * activation_exp(x * x * V(T(-0.5)));
    if constexpr (kWantValue) {
      *value = x * cdf;
    }
    return cdf + x * pdf;
  } else {
    // With s = sigmoid(2u): f = x s and f' = s + 2 x s (1 - s) u'.
    const auto x_sq = x * x;
    const auto inner = V(C::kTanhBeta) * (x + V(C::kKappa) * x_sq * x);
    const auto s = activation_sigmoid(inner + inner);
    if constexpr (kWantValue) {
      *value = x * s;
    }
    const auto inner_derivative = V(C::kTanhBeta) * (one + V(T(3) * C::kKappa) * x_sq);
    return s + V(T(2)) * x * s * (one - s) * inner_derivative;
  }
}

// Runs fn(std::integral_constant<Activation, A>{}) for the runtime `activation`.
template <typename Fn>
inline void dispatch_activation(Activation activation, const Fn& fn) {
  switch (activation) {
    case Activation::Silu:
      fn(std::integral_constant<Activation, Activation::Silu>{});
      break;
    case Activation::GeluErf:
      fn(std::integral_constant<Activation, Activation::GeluErf>{});
      break;
    case Activation::GeluTanh:
      fn(std::integral_constant<Activation, Activation::GeluTanh>{});
      break;
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
