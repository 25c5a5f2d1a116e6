#pragma once
// The CPU kernel tables of swiglu and geglu: filled by each capability's
// build of gated_activation_kernel.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/gated_activation.h"

namespace fuseops::cpu {

struct GatedActivationCpuKernels {
  static inline constinit CpuKernelTable<detail::GatedKernel> forward{"gated_kernel"};
  static inline constinit CpuKernelTable<detail::GatedBackwardKernel> backward{
      "gated_backward_kernel"};
};

using GatedActivationCpuRegistrations =
    detail::GatedActivationRegistrations<GatedActivationCpuKernels>;

}  // namespace fuseops::cpu
