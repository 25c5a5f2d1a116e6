// cross_entropy's CPU backend: its kernel tables and its dispatcher
// registration (linear_cross_entropy included: GEMMs plus the same kernels).

#include "ops/cpu/cross_entropy.h"

#include <torch/library.h>

namespace fuseops::cpu {

FUSEOPS_DEFINE_CPU_KERNEL(cross_entropy_target_kernel, detail::CrossEntropyTargetKernel);
FUSEOPS_DEFINE_CPU_KERNEL(cross_entropy_rows_kernel, detail::CrossEntropyRowsKernel);

namespace {

struct Kernels {
  static detail::CrossEntropyTargetKernel target() { return cross_entropy_target_kernel.get(); }
  static detail::CrossEntropyRowsKernel rows() { return cross_entropy_rows_kernel.get(); }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CPU, m) { detail::CrossEntropyRegistrations<Kernels>::register_all(m); }

}  // namespace fuseops::cpu
