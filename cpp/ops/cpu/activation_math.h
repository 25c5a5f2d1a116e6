#pragma once
// Vectorized GELU/SiLU math and float32-through loads/stores, for kernel
// files compiled per CPU capability. The formulas (and so the NaN/Inf
// behaviour) are those of ATen's CPU kernels (aten/src/ATen/native/cpu/
// Activation.cpp); bfloat16/float16 are computed in float32, float64 in double.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
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

// Loads and stores one block of scalar_t as Vectorized<opmath> registers:
// one register for float/double, two for bfloat16/float16 (a block is one
// Vectorized<scalar_t>, so the reduced types keep full-width loads).
template <typename scalar_t>
struct OpmathBlock {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = at::vec::Vectorized<opmath_t>;
  static constexpr bool kReduced = !std::is_same_v<scalar_t, opmath_t>;
  static constexpr int kRegisters = kReduced ? 2 : 1;
  static constexpr int64_t kSize = at::vec::Vectorized<scalar_t>::size();
  using Registers = std::array<Vec, kRegisters>;

  static Registers load(const scalar_t* p, int64_t count = kSize) {
    if constexpr (kReduced) {
      const auto [lo, hi] = at::vec::convert_to_float<scalar_t>(
          at::vec::Vectorized<scalar_t>::loadu(p, count));
      return {lo, hi};
    } else {
      return {Vec::loadu(p, count)};
    }
  }

  static void store(scalar_t* p, const Registers& v, int64_t count = kSize) {
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

// Activation value f(x).
template <Activation kAct, typename T>
inline at::vec::Vectorized<T> activation_value(const at::vec::Vectorized<T>& x) {
  using Vec = at::vec::Vectorized<T>;
  using C = GeluConstants<T>;
  if constexpr (kAct == Activation::Silu) {
    return x / (Vec(T(1)) + x.neg().exp());
  } else if constexpr (kAct == Activation::GeluErf) {
    return x * Vec(T(0.5)) * (Vec(T(1)) + (x * Vec(C::kAlpha)).erf());
  } else {
    const Vec x_cube = x * x * x;
    const Vec inner = Vec(C::kTanhBeta) * (x + Vec(C::kKappa) * x_cube);
    return Vec(T(0.5)) * x * (Vec(T(1)) + inner.tanh());
  }
}

// Derivative f'(x); with kWantValue also f(x), sharing the transcendental.
template <Activation kAct, bool kWantValue, typename T>
inline at::vec::Vectorized<T> activation_derivative(
    const at::vec::Vectorized<T>& x, std::type_identity_t<at::vec::Vectorized<T>>* value) {
  using Vec = at::vec::Vectorized<T>;
  using C = GeluConstants<T>;
  const Vec one(T(1));
  const Vec half(T(0.5));
  if constexpr (kAct == Activation::Silu) {
    const Vec sigmoid = one / (one + x.neg().exp());
    if constexpr (kWantValue) {
      *value = x * sigmoid;
    }
    return sigmoid * (one + x * (one - sigmoid));
  } else if constexpr (kAct == Activation::GeluErf) {
    const Vec cdf = half * (one + (x * Vec(C::kAlpha)).erf());
    const Vec pdf = Vec(C::kBeta) * (x * x * Vec(T(-0.5))).exp();
    if constexpr (kWantValue) {
      *value = x * cdf;
    }
    return cdf + x * pdf;
  } else {
    const Vec x_sq = x * x;
    const Vec inner = Vec(C::kTanhBeta) * (x + Vec(C::kKappa) * x_sq * x);
    const Vec tanh_inner = inner.tanh();
    const Vec right = one + tanh_inner;
    const Vec left = half * x;
    if constexpr (kWantValue) {
      *value = left * right;
    }
    const Vec right_derivative = (one - tanh_inner * tanh_inner) * Vec(C::kTanhBeta) *
                                 (one + Vec(T(3) * C::kKappa) * x_sq);
    return half * right + left * right_derivative;
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
