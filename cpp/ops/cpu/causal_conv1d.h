#pragma once
// causal_conv1d's CPU kernel tables: filled by each capability's build of
// causal_conv1d_kernel.cpp, defined and registered with the dispatcher in
// causal_conv1d.cpp.

#include "ops/causal_conv1d.h"
#include "ops/cpu/dispatch.h"

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(causal_conv1d_kernel, detail::CausalConv1dKernel);
FUSEOPS_DECLARE_CPU_KERNEL(causal_conv1d_backward_kernel, detail::CausalConv1dBackwardKernel);
FUSEOPS_DECLARE_CPU_KERNEL(causal_conv1d_update_kernel, detail::CausalConv1dUpdateKernel);
}  // namespace fuseops::cpu
