#pragma once
// The int4 linear family's CPU kernel tables: filled by each capability's
// build of int4_linear_kernel.cpp (W4A16) and int4_dynamic_linear_kernel.cpp
// (W4A8).

#include "ops/cpu/dispatch.h"
#include "ops/int4_linear.h"

namespace fuseops::cpu {

struct Int4LinearCpuKernels {
  static inline constinit CpuKernelTable<detail::Int4WeightOnlyLinearKernel> weight_only{
      "int4_weight_only_linear_kernel"};
  static inline constinit CpuKernelTable<detail::Int4DynamicLinearKernel> dynamic{
      "int4_dynamic_linear_kernel"};
};

using Int4LinearCpuRegistrations = detail::Int4LinearRegistrations<Int4LinearCpuKernels>;

}  // namespace fuseops::cpu
