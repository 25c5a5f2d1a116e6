#pragma once
// causal_conv1d's CPU kernel tables: filled by each capability's build of
// causal_conv1d_kernel.cpp.

#include "ops/causal_conv1d.h"
#include "ops/cpu/dispatch.h"

namespace fuseops::cpu {

struct CausalConv1dCpuKernels {
  static inline constinit CpuKernelTable<detail::CausalConv1dKernel> forward{
      "causal_conv1d_kernel"};
  static inline constinit CpuKernelTable<detail::CausalConv1dBackwardKernel> backward{
      "causal_conv1d_backward_kernel"};
  static inline constinit CpuKernelTable<detail::CausalConv1dUpdateKernel> update{
      "causal_conv1d_update_kernel"};
};

using CausalConv1dCpuRegistrations = detail::CausalConv1dRegistrations<CausalConv1dCpuKernels>;

}  // namespace fuseops::cpu
