// The CPU backend of swiglu and geglu: their kernel tables and their
// dispatcher registration.

#include "ops/cpu/gated_activation.h"

#include <torch/library.h>

namespace fuseops::cpu {

FUSEOPS_DEFINE_CPU_KERNEL(gated_kernel, detail::GatedKernel);
FUSEOPS_DEFINE_CPU_KERNEL(gated_backward_kernel, detail::GatedBackwardKernel);

namespace {

struct Kernels {
  static detail::GatedKernel forward() { return gated_kernel.get(); }
  static detail::GatedBackwardKernel backward() { return gated_backward_kernel.get(); }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CPU, m) { detail::GatedRegistrations<Kernels>::register_all(m); }

}  // namespace fuseops::cpu
