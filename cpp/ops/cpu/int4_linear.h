#pragma once
// The int4 linear family's CPU kernel tables: filled by each capability's
// build of int4_linear_kernel.cpp (W4A16) and int4_dynamic_linear_kernel.cpp
// (W4A8), registered in int4_linear.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/int4_linear.h"

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(int4_weight_only_linear_kernel, detail::Int4WeightOnlyLinearKernel);
FUSEOPS_DECLARE_CPU_KERNEL(int4_dynamic_linear_kernel, detail::Int4DynamicLinearKernel);
}  // namespace fuseops::cpu
