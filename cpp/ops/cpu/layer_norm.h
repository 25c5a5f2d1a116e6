#pragma once
// layer_norm's CPU kernel tables: filled by each capability's build of
// layer_norm_kernel.cpp, defined and registered with the dispatcher in
// layer_norm.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/layer_norm.h"

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(layer_norm_kernel, detail::LayerNormKernel);
FUSEOPS_DECLARE_CPU_KERNEL(layer_norm_backward_kernel, detail::LayerNormBackwardKernel);
}  // namespace fuseops::cpu
