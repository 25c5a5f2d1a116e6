#pragma once
// Symmetric int8 quantization of one row, the math of
// quantize_per_token_int8: scale = absmax / 127 (1 for a row whose absmax /
// 127 is 0), q = round(x / scale), ties to even. Shared by the quantize
// kernels and int8_dynamic_linear's activations; for kernel files compiled
// once per CPU capability.
//
// The row is read from memory once (absmax) and a second time from cache
// (divide, round, store int8); bfloat16/float16 are widened to float32 as
// they are loaded, in both passes.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops/cpu/elementwise.h"
#include "ops/cpu/int8_vec.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {

// What a row holding Inf or NaN gets.
enum class NonFiniteRow {
  // Nothing written; the caller refuses the input.
  kRefuse,
  // q = 0 and scale = NaN, so that whatever the row feeds comes out NaN.
  kNanScale,
};

// Quantizes the k values at x into q and *scale_out; false when the row
// holds Inf or NaN (then handled as kPolicy says).
template <NonFiniteRow kPolicy, typename scalar_t>
bool quantize_row_int8(const scalar_t* x, int64_t k, int8_t* q, float* scale_out) {
  using Block = OpmathBlock<scalar_t>;
  static_assert(std::is_same_v<typename Block::opmath_t, float>);
  constexpr int64_t W = FloatVec::size();
  // One accumulator per register of a block (two for bfloat16/float16).
  std::array<FloatVec, Block::kRegisters> amax_vec;
  amax_vec.fill(FloatVec(0.0f));
  for_each_block<Block::kSize>(k, [&](int64_t i, int64_t count) {
    const auto regs = Block::load(x + i, count);
    for (int r = 0; r < Block::kRegisters; ++r) {
      amax_vec[r] = at::vec::maximum(amax_vec[r], regs[r].abs());
    }
  });
  FloatVec all = amax_vec[0];
  for (int r = 1; r < Block::kRegisters; ++r) {
    all = at::vec::maximum(all, amax_vec[r]);
  }
  float lanes[W];
  all.store(lanes);
  float amax = 0.0f;
  for (int64_t j = 0; j < W; ++j) {
    // Written so that NaN makes it false: maximum() kept any NaN lane.
    if (!(lanes[j] <= std::numeric_limits<float>::max())) {
      if constexpr (kPolicy == NonFiniteRow::kNanScale) {
        std::memset(q, 0, static_cast<size_t>(k));
        *scale_out = std::numeric_limits<float>::quiet_NaN();
      }
      return false;
    }
    amax = std::max(amax, lanes[j]);
  }
  float scale = amax / 127.0f;
  // All zeros (or values so small that absmax/127 underflows): any scale
  // gives q = 0; 1 keeps dequantization finite.
  if (scale == 0.0f) {
    scale = 1.0f;
  }
  *scale_out = scale;
  const FloatVec s(scale);
  const FloatVec lo(-127.0f);
  const FloatVec hi(127.0f);
  for_each_block<Block::kSize>(k, [&](int64_t i, int64_t count) {
    const auto regs = Block::load(x + i, count);
    for (int r = 0; r < Block::kRegisters && r * W < count; ++r) {
      // Division (not a reciprocal multiply) so that q is exactly
      // round(x / scale) as the reference computes it; round() is to
      // nearest, ties to even. |x| <= absmax keeps the quotient within
      // 127 * (1 + 2^-23).
      const FloatVec rounded = at::vec::clamp((regs[r] / s).round(), lo, hi);
      store_float_as_int8(q + i + r * W, rounded, std::min(W, count - r * W));
    }
  });
  return true;
}

// float64 rows are rounded to float32 into `buffer` first; the other types
// leave it alone.
template <NonFiniteRow kPolicy, typename scalar_t>
bool quantize_row_int8(const scalar_t* x, int64_t k, int8_t* q, float* scale_out,
                       std::vector<float>& buffer) {
  if constexpr (std::is_same_v<scalar_t, double>) {
    buffer.resize(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) {
      buffer[i] = static_cast<float>(x[i]);
    }
    return quantize_row_int8<kPolicy>(buffer.data(), k, q, scale_out);
  } else {
    return quantize_row_int8<kPolicy>(x, k, q, scale_out);
  }
}

// The activations of the W8A8 kernels: one row quantized as above (Inf or
// NaN: kNanScale) into q, XOR 0x80 when `shift` (the unsigned form xq + 128
// that vpdpbusd takes); returns the scale, NaN when the row holds Inf or NaN
// (its q are then 0, or 0x80 shifted).
template <typename scalar_t>
float quantize_row_for_dot(const scalar_t* x, int64_t k, int8_t* q, bool shift,
                           std::vector<float>& buffer) {
  float scale;
  quantize_row_int8<NonFiniteRow::kNanScale>(x, k, q, &scale, buffer);
  if (shift) {
    for (int64_t i = 0; i < k; ++i) {
      q[i] = static_cast<int8_t>(static_cast<uint8_t>(q[i]) ^ 0x80u);
    }
  }
  return scale;
}

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
