#pragma once
// Vector helpers shared by the quantized linear kernel files (int8, int4,
// 2:4; compiled once per CPU capability): int8 <-> float32 conversions
// (values converted to int8 are already whole numbers in [-127, 127]) and
// the fused multiply-add every build rounds alike.

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>

#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/vec.h>

#include "ops/cpu/dispatch.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {

using FloatVec = at::vec::Vectorized<float>;

// Register tiles' accumulators, in the build's own vector type, converted
// to and from FloatVec at each use (no instruction): GCC kept an array of
// at::vec::Vectorized in memory once it held more than 8 vectors (a load
// and a store around every multiply-add), an array of __m512 in registers.
// Measured on an AVX-512 Xeon, one thread, bfloat16 rows in cache:
// int4_weight_only_linear's 8-row tile (1024 x 2048 weights) 603 -> 294 us.
#if defined(CPU_CAPABILITY_AVX512)
using Accumulator = __m512;
#elif defined(CPU_CAPABILITY_AVX2)
using Accumulator = __m256;
#else
using Accumulator = FloatVec;
#endif

// a * b + c rounded once, in every build: the AVX builds' fused multiply-add,
// and std::fma lane by lane in the DEFAULT build (whose target has no FMA
// instruction), so every build returns the same bits.
C10_ALWAYS_INLINE FloatVec fused_multiply_add(const FloatVec& a, const FloatVec& b,
                                              const FloatVec& c) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  return at::vec::fmadd(a, b, c);
#else
  constexpr int64_t W = FloatVec::size();
  float la[W], lb[W], lc[W];
  a.store(la);
  b.store(lb);
  c.store(lc);
  for (int64_t l = 0; l < W; ++l) {
    lc[l] = std::fma(la[l], lb[l], lc[l]);
  }
  return FloatVec::loadu(lc);
#endif
}

// Writes one output row's `channels` float32 results times `row_scale` (the
// activation row's scale; 1, which changes no bits, for float activations)
// plus the bias, rounded once to the output dtype. float64 outputs add the
// bias in float64; the others in float32.
template <typename scalar_t>
C10_ALWAYS_INLINE void store_output_channels(scalar_t* out, const float* row, int64_t channels,
                                             float row_scale, const scalar_t* bias) {
  using opmath_t = at::opmath_type<scalar_t>;
  for (int64_t c = 0; c < channels; ++c) {
    opmath_t value = static_cast<opmath_t>(row[c] * row_scale);
    if (bias != nullptr) {
      value += static_cast<opmath_t>(bias[c]);
    }
    out[c] = static_cast<scalar_t>(value);
  }
}

// `count` (at most FloatVec::size()) int8 values widened to float32; lanes
// past `count` are 0.
C10_ALWAYS_INLINE FloatVec load_int8_as_float(const int8_t* p, int64_t count = FloatVec::size()) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m128i bytes = count == 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))
                                    : _mm_maskz_loadu_epi8((__mmask16)((1u << count) - 1), p);
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
#elif defined(CPU_CAPABILITY_AVX2)
  int64_t word = 0;
  std::memcpy(&word, p, static_cast<size_t>(count));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(word)));
#else
  float lanes[FloatVec::size()] = {};
  for (int64_t j = 0; j < count; ++j) {
    lanes[j] = static_cast<float>(p[j]);
  }
  return FloatVec::loadu(lanes);
#endif
}

// W int32 values (exact integers below 2^24 in magnitude, so exactly) as
// float32.
C10_ALWAYS_INLINE FloatVec load_int32_as_float(const int32_t* p) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_cvtepi32_ps(_mm512_loadu_si512(p));
#elif defined(CPU_CAPABILITY_AVX2)
  return _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#else
  constexpr int64_t W = FloatVec::size();
  float lanes[W];
  for (int64_t l = 0; l < W; ++l) {
    lanes[l] = static_cast<float>(p[l]);
  }
  return FloatVec::loadu(lanes);
#endif
}

// Stores the first `count` lanes of `v` (whole numbers in [-127, 127]) as int8.
C10_ALWAYS_INLINE void store_float_as_int8(int8_t* p, const FloatVec& v,
                                           int64_t count = FloatVec::size()) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m128i bytes = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v));
  if (count == 16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bytes);
  } else {
    _mm_mask_storeu_epi8(p, (__mmask16)((1u << count) - 1), bytes);
  }
#elif defined(CPU_CAPABILITY_AVX2)
  const __m256i ints = _mm256_cvtps_epi32(v);
  const __m128i words =
      _mm_packs_epi32(_mm256_castsi256_si128(ints), _mm256_extracti128_si256(ints, 1));
  const int64_t bytes = _mm_cvtsi128_si64(_mm_packs_epi16(words, words));
  std::memcpy(p, &bytes, static_cast<size_t>(count));
#else
  float lanes[FloatVec::size()];
  v.store(lanes);
  for (int64_t j = 0; j < count; ++j) {
    p[j] = static_cast<int8_t>(lanes[j]);
  }
#endif
}

#if defined(CPU_CAPABILITY_AVX512)
// Whether the int8 kernels use AVX512_VNNI (vpdpbusd): the CPU has it and
// FUSEOPS_DISABLE_AVX512_VNNI is unset or "0" (a test switch, so that the
// AVX-512 paths without it run on CPUs with it). Read once; the branch on it
// is always predicted.
inline const bool kUseAvx512Vnni = (__builtin_cpu_init(), __builtin_cpu_supports("avx512vnni")) &&
                                   !disabled_by_test_switch("FUSEOPS_DISABLE_AVX512_VNNI");

// acc + the sums of each int32 lane's four products of unsigned bytes of
// `u8` by signed bytes of `s8` (vpdpbusd, wrapping modulo 2^32).
C10_ALWAYS_INLINE __m512i dot_u8_s8(__m512i acc, __m512i u8, __m512i s8) {
  // The compiler is not told about AVX512_VNNI (the build must run on
  // AVX-512 CPUs without it), hence asm; AT&T order: acc += first * second.
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));
  return acc;
}
#endif

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
