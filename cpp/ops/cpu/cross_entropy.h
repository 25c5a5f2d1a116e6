#pragma once
// cross_entropy's CPU kernel tables: filled by each capability's build of
// cross_entropy_kernel.cpp, defined and registered with the dispatcher in
// cross_entropy.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/cross_entropy.h"

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(cross_entropy_target_kernel, detail::CrossEntropyTargetKernel);
FUSEOPS_DECLARE_CPU_KERNEL(cross_entropy_rows_kernel, detail::CrossEntropyRowsKernel);
}  // namespace fuseops::cpu
