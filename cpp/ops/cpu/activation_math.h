#pragma once
// Vectorized GELU/SiLU math, for kernel files compiled per CPU capability.
// The results, NaN/Inf included, follow the exact formulas to float32
// rounding (tests compare with float64 math, not with ATen, whose special
// values differ between its own CPU builds: its AVX-512 gelu(+Inf) is NaN).
// The float32 exp is inlined here for speed and GELU-tanh goes through a
// sigmoid (see activation_value). bfloat16/float16 are computed in float32
// (elementwise.h loads them widened), float64 in double.

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
#include "ops/cpu/elementwise.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {

using detail::Activation;
using detail::dispatch_activation;
using detail::GeluConstants;

template <typename T>
using Vec = at::vec::Vectorized<T>;

// exp(x). float32 uses an inlined Cephes-style exp: n = round(x / ln 2),
// r = x - n ln 2 (ln 2 in two parts), e^r by a degree-5 polynomial (~1 ulp),
// and n added straight into the exponent bits (AVX-512: vscalefps). That is
// 18 vector operations (AVX-512: 13) and no call, about twice as fast as
// at::vec's exp() (a Sleef call) on AVX2, and the activations are bound by
// their operation count. Range: to float32 rounding for x in
// [-87, ln(FLT_MAX)]; +Inf above; 0 below -87, where e^x < 1.7e-38 (results
// near FLT_MIN are flushed, so that, as with std::exp, exp(-Inf) * Inf is
// NaN in a derivative); NaN stays NaN. float64 keeps at::vec's exp.
template <typename T>
C10_ALWAYS_INLINE Vec<T> activation_exp(const Vec<T>& x) {
  using V = Vec<T>;
  if constexpr (!std::is_same_v<T, float>) {
    return x.exp();
  } else {
#if defined(CPU_CAPABILITY_AVX512)
    // AVX-512 scales by 2^n in one instruction (vscalefps), which also
    // saturates to +Inf by itself; x is clamped first so that r stays small
    // (89 > ln(FLT_MAX) still overflows to +Inf; min returns its second
    // operand, x, when x is NaN). Lanes with x < -87 are zeroed by the same
    // instruction, as the other builds flush them: every build gives the
    // same results there (NaN compares "not less", so it stays NaN).
    const V clamped(_mm512_min_ps(V(89.0f), x));
    const __mmask16 in_range = _mm512_cmp_ps_mask(x, V(-87.0f), _CMP_NLT_UQ);
    const V n = (clamped * V(1.44269504088896341f)).round();
    V r = at::vec::fmadd(n, V(-0.693359375f), clamped);  // n * 0.693359375 is exact
#else
    const V max_x(88.72283935546875f);  // ln(FLT_MAX)
    const V min_x(-87.0f);
#if defined(CPU_CAPABILITY_DEFAULT)
    // Plain C++ lanes: out of range (or NaN), the float-to-int conversion
    // and the int addition below would be undefined behaviour, not merely
    // a value replaced afterwards. Those lanes compute e^0 instead; NaN is
    // put back at the end.
    const V is_nan = x.isnan();
    const V in = V::blendv(x, V(0.0f), (x > max_x) | (x < min_x) | is_nan);
#else
    // AVX2: the vector conversion saturates and the vector addition wraps,
    // so out-of-range lanes are computed and replaced below.
    const V& in = x;
#endif
    const V n = (in * V(1.44269504088896341f)).round();
    V r = at::vec::fmadd(n, V(-0.693359375f), in);  // n * 0.693359375 is exact
#endif
    r = at::vec::fmadd(n, V(2.12194440e-4f), r);
    V p(1.9875691500e-4f);
    p = at::vec::fmadd(p, r, V(1.3981999507e-3f));
    p = at::vec::fmadd(p, r, V(8.3334519073e-3f));
    p = at::vec::fmadd(p, r, V(4.1665795894e-2f));
    p = at::vec::fmadd(p, r, V(1.6666665459e-1f));
    p = at::vec::fmadd(p, r, V(5.0000001201e-1f));
    const V exp_r = at::vec::fmadd(p, r * r, r + V(1.0f));
#if defined(CPU_CAPABILITY_AVX512)
    return V(_mm512_maskz_scalef_ps(in_range, exp_r, n));
#else
    // e^r * 2^n: add n << 23 (computed exactly in float as n * 2^23) to the
    // bits. In range the result is a normal float (n = 128 only with
    // e^r <= 1); outside it the lanes are replaced below.
    const V y = at::vec::cast<float>(at::vec::cast<int32_t>(exp_r) +
                                     at::vec::convert<int32_t>(n * V(8388608.0f)));
    const V result = V::blendv(V::blendv(y, V(std::numeric_limits<float>::infinity()), x > max_x),
                               V(0.0f), x < min_x);
#if defined(CPU_CAPABILITY_DEFAULT)
    return V::blendv(result, x, is_nan);
#else
    return result;
#endif
#endif
  }
}

// 1 / (1 + exp(-x)).
template <typename T>
C10_ALWAYS_INLINE Vec<T> activation_sigmoid(const Vec<T>& x) {
  using V = Vec<T>;
  return V(T(1)) / (V(T(1)) + activation_exp(x.neg()));
}

// The standard normal CDF Phi(x) = 0.5 (1 + erf(x / sqrt(2))), and in
// *gauss exp(-x^2 / 2), which the GELU derivative needs too (one exp for
// both). float32: Abramowitz & Stegun 7.1.26 (|erf error| <= 1.5e-7, the
// formula of at::vec's float erf) applied to z = |x| / sqrt(2) gives the
// tail q = 0.5 (1 - erf(z)) = 0.5 t P(t) e^(-z^2) directly; Phi is q for
// x < 0 and 1 - q otherwise, so the negative tail keeps its relative
// accuracy instead of cancelling in 1 + erf. NaN stays NaN, Phi(+Inf) = 1,
// Phi(-Inf) = 0. float64 keeps at::vec's erf and exp.
template <typename T>
C10_ALWAYS_INLINE Vec<T> activation_normal_cdf(const Vec<T>& x, Vec<T>* gauss) {
  using V = Vec<T>;
  if constexpr (!std::is_same_v<T, float>) {
    *gauss = (x * x * V(T(-0.5))).exp();
    return V(T(0.5)) * (V(T(1)) + (x * V(GeluConstants<T>::kAlpha)).erf());
  } else {
    const V one(1.0f);
    const V t = one / at::vec::fmadd(V(0.3275911f * float(M_SQRT1_2)), x.abs(), one);
    // The A&S coefficients, halved.
    V r = at::vec::fmadd(V(0.5307027145f), t, V(-0.7265760135f));
    r = at::vec::fmadd(r, t, V(0.7107068705f));
    r = at::vec::fmadd(r, t, V(-0.142248368f));
    r = at::vec::fmadd(r, t, V(0.127414796f));
    *gauss = activation_exp(x * x * V(-0.5f));
    const V q = r * t * *gauss;
    return V::blendv(one - q, q, x < V(0.0f));
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
    V gauss;
    return x * activation_normal_cdf(x, &gauss);
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
  if constexpr (kAct == Activation::Silu) {
    const auto sigmoid = activation_sigmoid(x);
    if constexpr (kWantValue) {
      *value = x * sigmoid;
    }
    return sigmoid * (one + x * (one - sigmoid));
  } else if constexpr (kAct == Activation::GeluErf) {
    V gauss;
    const auto cdf = activation_normal_cdf(x, &gauss);
    const auto pdf = V(C::kBeta) * gauss;
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

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
