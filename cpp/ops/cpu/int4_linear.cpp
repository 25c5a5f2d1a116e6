// The int4 linear family's CPU backend: kernel tables and registration.

#include "ops/cpu/int4_linear.h"

#include <torch/library.h>

namespace fuseops::cpu {

FUSEOPS_DEFINE_CPU_KERNEL(int4_weight_only_linear_kernel, detail::Int4WeightOnlyLinearKernel);
FUSEOPS_DEFINE_CPU_KERNEL(int4_dynamic_linear_kernel, detail::Int4DynamicLinearKernel);

namespace {

struct Kernels {
  static detail::Int4WeightOnlyLinearKernel weight_only() {
    return int4_weight_only_linear_kernel.get();
  }
  static detail::Int4DynamicLinearKernel dynamic() { return int4_dynamic_linear_kernel.get(); }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CPU, m) { detail::Int4LinearRegistrations<Kernels>::register_all(m); }

}  // namespace fuseops::cpu
