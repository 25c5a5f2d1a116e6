#pragma once
// The int8 quantization family's CPU kernel tables: filled by each
// capability's build of quantize_kernel.cpp, registered in quantize.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/quantize.h"

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(quantize_rows_kernel, detail::QuantizeRowsKernel);
FUSEOPS_DECLARE_CPU_KERNEL(dequantize_kernel, detail::DequantizeKernel);
}  // namespace fuseops::cpu
