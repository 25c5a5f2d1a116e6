#pragma once
// The int8 quantization family's CPU kernel tables: filled by each
// capability's build of quantize_kernel.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/quantize.h"

namespace fuseops::cpu {

struct QuantizeCpuKernels {
  static inline constinit CpuKernelTable<detail::QuantizeRowsKernel> quantize{
      "quantize_rows_kernel"};
  static inline constinit CpuKernelTable<detail::DequantizeKernel> dequantize{"dequantize_kernel"};
};

using QuantizeCpuRegistrations = detail::QuantizeRegistrations<QuantizeCpuKernels>;

}  // namespace fuseops::cpu
