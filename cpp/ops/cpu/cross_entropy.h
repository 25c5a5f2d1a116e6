#pragma once
// cross_entropy's CPU kernel tables: filled by each capability's build of
// cross_entropy_kernel.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/cross_entropy.h"

namespace fuseops::cpu {

struct CrossEntropyCpuKernels {
  static inline constinit CpuKernelTable<detail::CrossEntropyTargetKernel> target{
      "cross_entropy_target_kernel"};
  static inline constinit CpuKernelTable<detail::CrossEntropyRowsKernel> rows{
      "cross_entropy_rows_kernel"};
};

using CrossEntropyCpuRegistrations = detail::CrossEntropyRegistrations<CrossEntropyCpuKernels>;

}  // namespace fuseops::cpu
