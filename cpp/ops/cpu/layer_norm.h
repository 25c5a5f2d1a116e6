#pragma once
// layer_norm's CPU kernel tables: filled by each capability's build of
// layer_norm_kernel.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/layer_norm.h"

namespace fuseops::cpu {

struct LayerNormCpuKernels {
  static inline constinit CpuKernelTable<detail::LayerNormKernel> forward{"layer_norm_kernel"};
  static inline constinit CpuKernelTable<detail::LayerNormBackwardKernel> backward{
      "layer_norm_backward_kernel"};
};

using LayerNormCpuRegistrations = detail::LayerNormRegistrations<LayerNormCpuKernels>;

}  // namespace fuseops::cpu
