#pragma once
// The int4 linear family's CPU kernel tables: filled by each capability's
// build of int4_linear_kernel.cpp, registered in int4_linear.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/int4_linear.h"

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(int4_weight_only_linear_kernel, detail::Int4WeightOnlyLinearKernel);
}  // namespace fuseops::cpu
