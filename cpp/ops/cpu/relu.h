#pragma once
// relu's CPU kernel tables: filled by each capability's build of
// relu_kernel.cpp, defined and registered with the dispatcher in relu.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/relu.h"

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(relu_kernel, detail::ReluKernel);
FUSEOPS_DECLARE_CPU_KERNEL(relu_backward_kernel, detail::ReluBackwardKernel);
}  // namespace fuseops::cpu
