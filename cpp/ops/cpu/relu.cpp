// relu's CPU backend: its kernel tables and its dispatcher registration.

#include "ops/cpu/relu.h"

#include <torch/library.h>

namespace fuseops::cpu {

FUSEOPS_DEFINE_CPU_KERNEL(relu_kernel, detail::ReluKernel);
FUSEOPS_DEFINE_CPU_KERNEL(relu_backward_kernel, detail::ReluBackwardKernel);

namespace {

struct Kernels {
  static detail::ReluKernel forward() { return relu_kernel.get(); }
  static detail::ReluBackwardKernel backward() { return relu_backward_kernel.get(); }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CPU, m) { detail::ReluRegistrations<Kernels>::register_all(m); }

}  // namespace fuseops::cpu
