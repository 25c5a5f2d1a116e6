#pragma once
// The CPU kernel tables of gelu, silu and bias_gelu: filled by each
// capability's build of activation_kernel.cpp.

#include "ops/activation.h"
#include "ops/cpu/dispatch.h"

namespace fuseops::cpu {

struct ActivationCpuKernels {
  static inline constinit CpuKernelTable<detail::ActivationKernel> forward{"activation_kernel"};
  static inline constinit CpuKernelTable<detail::ActivationBackwardKernel> backward{
      "activation_backward_kernel"};
  static inline constinit CpuKernelTable<detail::BiasGeluKernel> bias_gelu{"bias_gelu_kernel"};
  static inline constinit CpuKernelTable<detail::BiasGeluBackwardKernel> bias_gelu_backward{
      "bias_gelu_backward_kernel"};
};

using ActivationCpuRegistrations = detail::ActivationRegistrations<ActivationCpuKernels>;

}  // namespace fuseops::cpu
