// The 2:4 sparse linear family's CPU backend: kernel table and registration.

#include "ops/cpu/sparse_2_4.h"

#include <torch/library.h>

namespace fuseops::cpu {

FUSEOPS_DEFINE_CPU_KERNEL(sparse_2_4_linear_kernel, detail::Sparse24LinearKernel);
FUSEOPS_DEFINE_CPU_KERNEL(sparse_2_4_dynamic_linear_kernel, detail::Sparse24DynamicLinearKernel);

namespace {

struct Kernels {
  static detail::Sparse24LinearKernel linear() { return sparse_2_4_linear_kernel.get(); }
  static detail::Sparse24DynamicLinearKernel dynamic() {
    return sparse_2_4_dynamic_linear_kernel.get();
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CPU, m) { detail::Sparse24Registrations<Kernels>::register_all(m); }

}  // namespace fuseops::cpu
