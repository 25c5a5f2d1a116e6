#pragma once
// linear's CPU kernel table: filled by each capability's build of
// linear_kernel.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/linear.h"

namespace fuseops::cpu {

struct LinearCpuKernels {
  static inline constinit CpuKernelTable<detail::LinearKernel> forward{"linear_kernel"};
};

using LinearCpuRegistrations = detail::LinearRegistrations<LinearCpuKernels>;

}  // namespace fuseops::cpu
