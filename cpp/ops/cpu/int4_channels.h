#pragma once
// What both int4 CPU kernels (W4A16 and W4A8) share of one block of 16
// output channels besides its weights: their tasks (a block times a chunk of
// rows), and the block's scales and zero points in a group, from
// scale_zero [groups, 2, N], float32 or bfloat16. Included by kernel files
// compiled per CPU capability.

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>

#include "ops/cpu/int8_vec.h"
#include "ops/int4_linear.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {

// One task of an int4 linear: the block of kInt4BlockN output channels
// `block` (the packed layout's unit), channels [channel0, channel0 +
// channels) of n, over rows [m_begin, m_end) of m_total. Tasks are numbered
// block-major: task t is block t / chunks, chunk t % chunks of chunk_rows.
struct Int4Task {
  int64_t block, m_begin, m_end, channel0, channels;

  static Int4Task of(int64_t task, int64_t chunks, int64_t chunk_rows, int64_t m_total, int64_t n) {
    constexpr int64_t kBlockN = detail::kInt4BlockN;
    const int64_t block = task / chunks;
    const int64_t m_begin = (task % chunks) * chunk_rows;
    return {block, m_begin, std::min(m_total, m_begin + chunk_rows), block * kBlockN,
            std::min(kBlockN, n - block * kBlockN)};
  }
};

// The 16 values of one block's channels in a row of scale_zero (`count` of
// them real, the rest 0) as kInt4BlockN / FloatVec::size() vectors. A whole
// block (every block but perhaps the last) is loaded where it lies; only a
// partial last block goes through a zero-filled buffer.
C10_ALWAYS_INLINE void load_channels(const float* p, int64_t count, FloatVec* out) {
  constexpr int64_t kBlockN = detail::kInt4BlockN;
  constexpr int64_t W = FloatVec::size();
  if (count == kBlockN) {
    for (int64_t v = 0; v < kBlockN / W; ++v) {
      out[v] = FloatVec::loadu(p + v * W);
    }
    return;
  }
  float lanes[kBlockN] = {};
  std::memcpy(lanes, p, sizeof(float) * static_cast<size_t>(count));
  for (int64_t v = 0; v < kBlockN / W; ++v) {
    out[v] = FloatVec::loadu(lanes + v * W);
  }
}

// The same from bfloat16 values: each widened to the float32 of its bits
// (exact): a whole block by one zero-extension and shift per vector.
C10_ALWAYS_INLINE void load_channels(const uint16_t* p, int64_t count, FloatVec* out) {
  constexpr int64_t kBlockN = detail::kInt4BlockN;
#if defined(CPU_CAPABILITY_AVX512)
  static_assert(kBlockN == 16);
  if (count == kBlockN) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    out[0] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    return;
  }
#elif defined(CPU_CAPABILITY_AVX2)
  static_assert(kBlockN == 16);
  if (count == kBlockN) {
    for (int v = 0; v < 2; ++v) {
      const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * v));
      out[v] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
    }
    return;
  }
#endif
  float lanes[kBlockN];
  for (int64_t i = 0; i < kBlockN; ++i) {
    const uint32_t bits = i < count ? static_cast<uint32_t>(p[i]) << 16 : 0;
    std::memcpy(lanes + i, &bits, sizeof(bits));
  }
  load_channels(lanes, kBlockN, out);
}

// scale_zero as the kernels read it: group g's row of scales (2g) and of
// zero points (2g + 1), one block of 16 channels at a time. bfloat16
// scale_zero halves these bytes, which a decode step streams with the
// weights (1/16 of an int4 weight's bytes at groups of 128 in float32).
class ScaleZeroRows {
 public:
  explicit ScaleZeroRows(const at::Tensor& scale_zero)
      : data_(static_cast<const char*>(scale_zero.const_data_ptr())),
        element_(static_cast<int64_t>(scale_zero.element_size())),
        n_(scale_zero.size(2)) {}

  // Group g's scales and negated zero points of the block of channels at
  // channel0 (`count` of them real). Also asks for the same lines of the
  // next block: a block of 16 channels touches one line in each of the
  // 2 * groups rows N elements apart, a pattern the hardware prefetcher does
  // not follow, so while a task works on one block this fetches the next
  // block's a whole block of weight bytes ahead.
  C10_ALWAYS_INLINE void load(int64_t g, int64_t channel0, int64_t count, FloatVec* scale,
                              FloatVec* neg_zero) const {
    constexpr int64_t kBlockN = detail::kInt4BlockN;
    const int64_t scales = (2 * g) * n_;
    const int64_t zeros = (2 * g + 1) * n_;
    if (channel0 + kBlockN < n_) {
      __builtin_prefetch(data_ + (scales + channel0 + kBlockN) * element_, 0, 3);
      __builtin_prefetch(data_ + (zeros + channel0 + kBlockN) * element_, 0, 3);
    }
    row(scales + channel0, count, scale);
    row(zeros + channel0, count, neg_zero);
    for (int64_t v = 0; v < kBlockN / FloatVec::size(); ++v) {
      neg_zero[v] = neg_zero[v].neg();
    }
  }

 private:
  C10_ALWAYS_INLINE void row(int64_t index, int64_t count, FloatVec* out) const {
    if (element_ == 2) {
      load_channels(reinterpret_cast<const uint16_t*>(data_) + index, count, out);
    } else {
      load_channels(reinterpret_cast<const float*>(data_) + index, count, out);
    }
  }

  const char* data_;
  int64_t element_;
  int64_t n_;
};

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
