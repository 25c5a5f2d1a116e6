#pragma once
// GELU/SiLU value and derivative on the device, in opmath (float for
// bfloat16/float16, double for double), with the formulas of the CPU kernels
// (cpp/ops/cpu/activation_math.h): ATen's, except GELU-tanh, written as
// x * sigmoid(2u) (= 0.5 x (1 + tanh(u))), which does not cancel for
// negative x.

#include <cmath>

#include "ops/activation.h"

namespace fuseops::cuda {

using detail::Activation;
using detail::dispatch_activation;
using detail::GeluConstants;

__device__ __forceinline__ float device_erf(float x) { return erff(x); }
__device__ __forceinline__ double device_erf(double x) { return erf(x); }
__device__ __forceinline__ float device_exp(float x) { return expf(x); }
__device__ __forceinline__ double device_exp(double x) { return exp(x); }

template <Activation kAct, typename T>
__device__ __forceinline__ T activation_value(T x) {
  using C = GeluConstants<T>;
  if constexpr (kAct == Activation::Silu) {
    return x / (T(1) + device_exp(-x));
  } else if constexpr (kAct == Activation::GeluErf) {
    return x * T(0.5) * (T(1) + device_erf(x * C::kAlpha));
  } else {
    const T inner = C::kTanhBeta * (x + C::kKappa * x * x * x);
    return x / (T(1) + device_exp(T(-2) * inner));
  }
}

// f'(x); f(x) into *value as well when `value` is not null.
template <Activation kAct, typename T>
__device__ __forceinline__ T activation_derivative(T x, T* value) {
  using C = GeluConstants<T>;
  if constexpr (kAct == Activation::Silu) {
    const T sigmoid = T(1) / (T(1) + device_exp(-x));
    if (value != nullptr) {
      *value = x * sigmoid;
    }
    return sigmoid * (T(1) + x * (T(1) - sigmoid));
  } else if constexpr (kAct == Activation::GeluErf) {
    const T cdf = T(0.5) * (T(1) + device_erf(x * C::kAlpha));
    const T pdf = C::kBeta * device_exp(T(-0.5) * x * x);
    if (value != nullptr) {
      *value = x * cdf;
    }
    return cdf + x * pdf;
  } else {
    // With s = sigmoid(2u): f = x s and f' = s + 2 x s (1 - s) u'.
    const T x_sq = x * x;
    const T inner = C::kTanhBeta * (x + C::kKappa * x_sq * x);
    const T s = T(1) / (T(1) + device_exp(T(-2) * inner));
    if (value != nullptr) {
      *value = x * s;
    }
    const T inner_derivative = C::kTanhBeta * (T(1) + T(3) * C::kKappa * x_sq);
    return s + T(2) * x * s * (T(1) - s) * inner_derivative;
  }
}

}  // namespace fuseops::cuda
