#pragma once
// relu's CPU kernel tables: filled by each capability's build of
// relu_kernel.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/relu.h"

namespace fuseops::cpu {

struct ReluCpuKernels {
  static inline constinit CpuKernelTable<detail::ReluKernel> forward{"relu_kernel"};
  static inline constinit CpuKernelTable<detail::ReluBackwardKernel> backward{
      "relu_backward_kernel"};
};

using ReluCpuRegistrations = detail::ReluRegistrations<ReluCpuKernels>;

}  // namespace fuseops::cpu
