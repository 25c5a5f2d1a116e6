// The CPU backend of gelu, silu and bias_gelu: their kernel tables and their
// dispatcher registration.

#include "ops/cpu/activation.h"

#include <torch/library.h>

namespace fuseops::cpu {

FUSEOPS_DEFINE_CPU_KERNEL(activation_kernel, detail::ActivationKernel);
FUSEOPS_DEFINE_CPU_KERNEL(activation_backward_kernel, detail::ActivationBackwardKernel);
FUSEOPS_DEFINE_CPU_KERNEL(bias_gelu_kernel, detail::BiasGeluKernel);
FUSEOPS_DEFINE_CPU_KERNEL(bias_gelu_backward_kernel, detail::BiasGeluBackwardKernel);

namespace {

struct Kernels {
  static detail::ActivationKernel forward() { return activation_kernel.get(); }
  static detail::ActivationBackwardKernel backward() { return activation_backward_kernel.get(); }
  static detail::BiasGeluKernel bias_gelu() { return bias_gelu_kernel.get(); }
  static detail::BiasGeluBackwardKernel bias_gelu_backward() {
    return bias_gelu_backward_kernel.get();
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CPU, m) { detail::ActivationRegistrations<Kernels>::register_all(m); }

}  // namespace fuseops::cpu
