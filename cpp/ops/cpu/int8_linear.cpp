// The int8 linear family's CPU backend: kernel tables and registration.

#include "ops/cpu/int8_linear.h"

#include <torch/library.h>

namespace fuseops::cpu {

FUSEOPS_DEFINE_CPU_KERNEL(int8_weight_only_linear_kernel, detail::Int8WeightOnlyLinearKernel);
FUSEOPS_DEFINE_CPU_KERNEL(int8_dynamic_linear_kernel, detail::Int8DynamicLinearKernel);

namespace {

struct Kernels {
  static detail::Int8WeightOnlyLinearKernel weight_only() {
    return int8_weight_only_linear_kernel.get();
  }
  static detail::Int8DynamicLinearKernel dynamic() { return int8_dynamic_linear_kernel.get(); }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CPU, m) { detail::Int8LinearRegistrations<Kernels>::register_all(m); }

}  // namespace fuseops::cpu
