#pragma once
// The CPU kernel tables of swiglu and geglu: filled by each capability's build
// of gated_activation_kernel.cpp, defined and registered with the dispatcher
// in gated_activation.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/gated_activation.h"

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(gated_kernel, detail::GatedKernel);
FUSEOPS_DECLARE_CPU_KERNEL(gated_backward_kernel, detail::GatedBackwardKernel);
}  // namespace fuseops::cpu
