#pragma once
// The CPU kernel tables of gelu, silu and bias_gelu: filled by each
// capability's build of activation_kernel.cpp, defined and registered with the
// dispatcher in activation.cpp.

#include "ops/activation.h"
#include "ops/cpu/dispatch.h"

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(activation_kernel, detail::ActivationKernel);
FUSEOPS_DECLARE_CPU_KERNEL(activation_backward_kernel, detail::ActivationBackwardKernel);
FUSEOPS_DECLARE_CPU_KERNEL(bias_gelu_kernel, detail::BiasGeluKernel);
FUSEOPS_DECLARE_CPU_KERNEL(bias_gelu_backward_kernel, detail::BiasGeluBackwardKernel);
}  // namespace fuseops::cpu
