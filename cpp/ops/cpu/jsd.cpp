// jsd's CPU backend: its kernel table and its dispatcher registration.

#include "ops/cpu/jsd.h"

#include <torch/library.h>

namespace fuseops::cpu {

FUSEOPS_DEFINE_CPU_KERNEL(jsd_rows_kernel, detail::JsdRowsKernel);

namespace {

struct Kernels {
  static detail::JsdRowsKernel rows() { return jsd_rows_kernel.get(); }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CPU, m) { detail::JsdRegistrations<Kernels>::register_all(m); }

}  // namespace fuseops::cpu
