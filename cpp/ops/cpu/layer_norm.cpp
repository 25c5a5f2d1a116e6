// layer_norm's CPU backend: its kernel tables and its dispatcher registration.

#include "ops/cpu/layer_norm.h"

#include <torch/library.h>

namespace fuseops::cpu {

FUSEOPS_DEFINE_CPU_KERNEL(layer_norm_kernel, detail::LayerNormKernel);
FUSEOPS_DEFINE_CPU_KERNEL(layer_norm_backward_kernel, detail::LayerNormBackwardKernel);

namespace {

struct Kernels {
  static detail::LayerNormKernel forward() { return layer_norm_kernel.get(); }
  static detail::LayerNormBackwardKernel backward() { return layer_norm_backward_kernel.get(); }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CPU, m) { detail::LayerNormRegistrations<Kernels>::register_all(m); }

}  // namespace fuseops::cpu
