#pragma once
// The CPU kernel tables of rms_norm and fused_add_rms_norm: filled by each
// capability's build of rms_norm_kernel.cpp, defined and registered with the
// dispatcher in rms_norm.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/rms_norm.h"

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(rms_norm_forward_kernel, detail::RmsNormForwardKernel);
FUSEOPS_DECLARE_CPU_KERNEL(rms_norm_backward_kernel, detail::RmsNormBackwardKernel);
}  // namespace fuseops::cpu
