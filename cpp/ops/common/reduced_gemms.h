#pragma once
// Whether ATen's matrix products of a bfloat16/float16 tensor run on
// dot-product instructions for the type on this CPU, or emulate it.

#include <ATen/core/ScalarType.h>

namespace fuseops::detail {

// True for bfloat16 on CPUs without AVX512_BF16 or AMX-BF16, and for float16
// without AVX512_FP16 or AMX-FP16: there ATen emulates the type (measured on
// an AVX-512 Xeon without AVX512_BF16/FP16: bfloat16 GEMMs of a [256 x 2048] x
// [2048 x 32000] product took 4-5x the time of the float32 one, float16
// 7-300x). False for every other dtype. The environment variable
// FUSEOPS_REDUCED_GEMMS ("emulated" or "native"; read at every call, so that
// the tests run both ways on any CPU) overrides the detection. The ops that
// choose by it: the fused linear losses (float32 products on widened
// operands, widened_products.h) and linear (its streaming kernel up to 8
// rows instead of 4, widened products from 32 rows).
bool reduced_gemms_emulated(at::ScalarType dtype);

// True on CPUs with AVX512_BF16 and without AMX-BF16 (Zen 4, Cooper Lake)
// unless FUSEOPS_REDUCED_GEMMS is set (then it decides alone): there ATen's
// bfloat16 products of a few rows read the weight slower than linear's
// vdpbf16ps stream (measured on a 2-core Zen 4, 8 rows by weights of 1024
// columns: ATen 7-12 GB/s, the stream 14-17), so linear streams up to 8
// bfloat16 rows there too.
bool bfloat16_dot_products_without_amx();

// Whether the int8 and int4 weight-only kernels (int8_weight_only_linear,
// int4_weight_only_linear) multiply bfloat16 activations by vdpbf16ps on
// weights widened to bfloat16 pairs (on CPUs with AVX512_BF16: the kernels
// also test kCpuHasAvx512Bf16), or widen both to float32. By default the
// pairs where the CPU has no AMX-BF16 (Zen 4, where they were faster),
// float32 where it has: vdpbf16ps takes two cycles there. Measured on a Xeon
// with AMX, one thread, one to eight rows of bfloat16 in cache:
// - int8 (512 x 1024 weights, one row): float32 25.8 against 14.3 G weights
//   per second; 5632 x 2048 from memory, two threads: 745 against 1035 us
//   at one row, 1545 against 1770 at eight;
// - int4 (1024 x 2048 weights): float32 96 / 176 / 294 us at 1 / 4 / 8
//   rows against the pairs' 98 / 236 / 432, and 478 against 664 at 12.
// FUSEOPS_WEIGHT_PAIRS ("1" or "0"; read at every call, so that the tests
// run both paths on either kind of CPU) overrides the choice.
bool weight_pairs();

}  // namespace fuseops::detail
