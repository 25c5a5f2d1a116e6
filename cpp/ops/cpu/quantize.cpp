// The int8 quantization family's CPU backend: kernel tables and registration.

#include "ops/cpu/quantize.h"

#include <torch/library.h>

namespace fuseops::cpu {

FUSEOPS_DEFINE_CPU_KERNEL(quantize_rows_kernel, detail::QuantizeRowsKernel);
FUSEOPS_DEFINE_CPU_KERNEL(dequantize_kernel, detail::DequantizeKernel);

namespace {

struct Kernels {
  static detail::QuantizeRowsKernel quantize() { return quantize_rows_kernel.get(); }
  static detail::DequantizeKernel dequantize() { return dequantize_kernel.get(); }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CPU, m) { detail::QuantizeRegistrations<Kernels>::register_all(m); }

}  // namespace fuseops::cpu
