// linear's CPU backend: its kernel table and its dispatcher registration.

#include "ops/cpu/linear.h"

#include <torch/library.h>

namespace fuseops::cpu {

FUSEOPS_DEFINE_CPU_KERNEL(linear_kernel, detail::LinearKernel);

namespace {

struct Kernels {
  static detail::LinearKernel forward() { return linear_kernel.get(); }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CPU, m) { detail::LinearRegistrations<Kernels>::register_all(m); }

}  // namespace fuseops::cpu
