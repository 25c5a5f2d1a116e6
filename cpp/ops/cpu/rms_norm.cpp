// The CPU backend of rms_norm and fused_add_rms_norm: their kernel tables and
// their dispatcher registration.

#include "ops/cpu/rms_norm.h"

#include <torch/library.h>

namespace fuseops::cpu {

FUSEOPS_DEFINE_CPU_KERNEL(rms_norm_forward_kernel, detail::RmsNormForwardKernel);
FUSEOPS_DEFINE_CPU_KERNEL(rms_norm_backward_kernel, detail::RmsNormBackwardKernel);

namespace {

struct Kernels {
  static detail::RmsNormForwardKernel forward() { return rms_norm_forward_kernel.get(); }
  static detail::RmsNormBackwardKernel backward() { return rms_norm_backward_kernel.get(); }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CPU, m) { detail::RmsNormRegistrations<Kernels>::register_all(m); }

}  // namespace fuseops::cpu
