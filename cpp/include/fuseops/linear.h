#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

namespace fuseops {

// torch.nn.functional.linear with a kernel for the few-row products of
// decoding: y = input @ weight^T + bias.
//   input [..., K], weight [N, K], bias optional [N], one floating dtype
//   (float32, bfloat16, float16 or float64), any strides.
// Returns [..., N] (contiguous, input's dtype). On CPU, 1 to
// kLinearStreamRows rows (the product of input's leading dimensions: the
// tokens of a decode step; kLinearStreamRowsEmulated in bfloat16/float16
// where ATen emulates the type) run a kernel
// that reads the weight from memory once, all threads on disjoint output
// channels, summing each output in float32 on its own (its bits do not
// depend on the other rows or the thread count). Other calls run ATen's
// matrix product (torch's own linear): more rows, whose weights are reused
// enough for a blocked GEMM to win, float64, and other devices; bfloat16/
// float16 products of kLinearWidenedRows rows or more, where ATen emulates
// the type, run in float32 on widened operands (exact products, float32
// sums, as ATen's). Gradients: input, weight and bias, with ATen's matrix
// products (widened as the forward's where it widens; double backward
// too, with ATen's).
at::Tensor linear(const at::Tensor& input, const at::Tensor& weight,
                  const std::optional<at::Tensor>& bias = std::nullopt);

// Rows up to which the CPU kernel streams the weight (more take ATen's
// matrix product, faster once each weight serves more rows: measured on
// AVX-512 with AMX, bfloat16 8 rows: ATen 12-19 GB/s, the stream 7-12).
inline constexpr int64_t kLinearStreamRows = 4;
// The same for bfloat16/float16 on CPUs without dot-product instructions
// for the type (no AVX512_BF16/AMX, no AVX512_FP16/AMX-FP16), where ATen
// emulates it at a few times the float32 product's time.
inline constexpr int64_t kLinearStreamRowsEmulated = 8;
// Where ATen emulates bfloat16/float16, products of at least this many rows
// run (forward and backward) as float32 products of the operands widened
// block by block: 2-4x ATen's emulated product from 64 rows; fewer rows gain
// less than widening the weight costs.
inline constexpr int64_t kLinearWidenedRows = 32;

}  // namespace fuseops
