// causal_conv1d's CPU backend: its kernel tables and its dispatcher registration.

#include "ops/cpu/causal_conv1d.h"

#include <torch/library.h>

namespace fuseops::cpu {

FUSEOPS_DEFINE_CPU_KERNEL(causal_conv1d_kernel, detail::CausalConv1dKernel);
FUSEOPS_DEFINE_CPU_KERNEL(causal_conv1d_backward_kernel, detail::CausalConv1dBackwardKernel);
FUSEOPS_DEFINE_CPU_KERNEL(causal_conv1d_update_kernel, detail::CausalConv1dUpdateKernel);

namespace {

struct Kernels {
  static detail::CausalConv1dKernel forward() { return causal_conv1d_kernel.get(); }
  static detail::CausalConv1dBackwardKernel backward() {
    return causal_conv1d_backward_kernel.get();
  }
  static detail::CausalConv1dUpdateKernel update() { return causal_conv1d_update_kernel.get(); }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CPU, m) { detail::CausalConv1dRegistrations<Kernels>::register_all(m); }

}  // namespace fuseops::cpu
