#pragma once
// What both int4 CPU kernels (W4A16 and W4A8) read of one block of 16
// output channels besides its weights: a row of the scales or zero points,
// [groups, 2, N] float32. Included by kernel files compiled per CPU
// capability.

#include <cstdint>
#include <cstring>

#include <c10/macros/Macros.h>

#include "ops/cpu/int8_vec.h"
#include "ops/int4_linear.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {

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

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
