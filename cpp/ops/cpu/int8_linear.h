#pragma once
// The int8 linear family's CPU kernel tables: filled by each capability's
// build of int8_linear_kernel.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/int8_linear.h"

namespace fuseops::cpu {

struct Int8LinearCpuKernels {
  static inline constinit CpuKernelTable<detail::Int8WeightOnlyLinearKernel> weight_only{
      "int8_weight_only_linear_kernel"};
  static inline constinit CpuKernelTable<detail::Int8DynamicLinearKernel> dynamic{
      "int8_dynamic_linear_kernel"};
};

using Int8LinearCpuRegistrations = detail::Int8LinearRegistrations<Int8LinearCpuKernels>;

}  // namespace fuseops::cpu
