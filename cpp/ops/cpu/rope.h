#pragma once
// rope's CPU kernel table: filled by each capability's build of
// rope_kernel.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/rope.h"

namespace fuseops::cpu {

struct RopeCpuKernels {
  static inline constinit CpuKernelTable<detail::RopeKernel> rope{"rope_kernel"};
};

using RopeCpuRegistrations = detail::RopeRegistrations<RopeCpuKernels>;

}  // namespace fuseops::cpu
