#pragma once
// The int8 linear family's CPU kernel tables: filled by each capability's
// build of int8_linear_kernel.cpp, registered in int8_linear.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/int8_linear.h"

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(int8_weight_only_linear_kernel, detail::Int8WeightOnlyLinearKernel);
FUSEOPS_DECLARE_CPU_KERNEL(int8_dynamic_linear_kernel, detail::Int8DynamicLinearKernel);
}  // namespace fuseops::cpu
