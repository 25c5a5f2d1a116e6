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
// also test kCpuHasAvx512Bf16), or widen both to float32. By default:
// - int8: the pairs where the CPU has no AMX-BF16 (Zen 4, where they were
//   faster), float32 where it has: on a Xeon with AMX, float32 was faster
//   at every row count (one row of 512 x 1024 weights in cache, one thread:
//   25.8 against 14.3 G weights per second; 5632 x 2048 from memory, two
//   threads: 745 against 1035 us at one row, 1545 against 1770 at eight);
// - int4: the pairs on every CPU with AVX512_BF16: on the same Xeon float32
//   was faster at one and four rows (374 against 408 us, 556 against 726)
//   but slower at eight (1724 against 1217), and a decode step at batch 8
//   lost more (18.1 -> 23.2 ms) than one at batch 1 gained (6.2 -> 6.1).
//   Since the pairs' decode takes three instructions, they match float32 at
//   one row (one row of 1024 x 2048 weights in cache, one thread: 97
//   against 96 us) and still lose at four (235 against 175), win at eight
//   (429 against 606).
// FUSEOPS_WEIGHT_PAIRS ("1" or "0"; read at every call, so that the tests
// run both paths on either kind of CPU) overrides both.
bool int8_weight_pairs();
bool int4_weight_pairs();

}  // namespace fuseops::detail
