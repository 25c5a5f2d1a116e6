#pragma once

#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>

namespace fuseops {

// 2:4 semi-structured sparsity: of every group of 4 consecutive input
// features (along K) of a linear layer's weight [N, K], at most 2 are
// nonzero. A packed weight stores only the kept values and a bitmask:
//
//   values  [N, K/2], the weight's dtype (float32, float64, bfloat16,
//           float16 or int8): the 2 kept values of each group, in K order.
//   meta    uint8 [N, ceil(K/8)]: bit 4*(g%2) + j of meta[n, g/2] is set
//           when weight[n, 4g + j] is kept (low nibble: even groups, high
//           nibble: odd ones; a trailing unused nibble is 0). Read as
//           little-endian 16-bit words, the mask of 16 consecutive K values
//           has bit i set for k = i: the AVX-512 kernels' expand mask
//           (vexpandps); the AVX2 kernels look each byte up in a table of
//           permutations (vpermps).
//   scale   float32 [N]: per-channel scales, applied once per output; the
//           int8 weight's own, ones for a float weight unless given.
//
// K must be a multiple of 4. The values are half of the dense weight's
// bytes; the bitmask adds 1/8 byte per weight.

// The weight with, in each group of 4 along K, the 2 values of largest
// magnitude kept and the other 2 set to 0 (float dtypes, K a multiple of
// 4). NaN counts as the largest magnitude; among equal magnitudes the
// lower index is kept. Inference op: called on a tensor that requires
// grad with grad mode on it raises.
at::Tensor prune_2_4(const at::Tensor& weight);

// Packs a 2:4 weight [N, K] (float32, float64, bfloat16, float16, or int8
// from quantize_per_channel_int8 with its float32 scale [N], required for
// int8) into (values, meta, scale). A group with more than 2 nonzeros is
// refused, naming the first such row and group (prune_2_4 first). A group
// with fewer keeps zeros at its lowest free positions, so every group
// stores exactly 2 values. Inference op.
std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_2_4(
    const at::Tensor& weight, const std::optional<at::Tensor>& scale = std::nullopt);

// y = x @ (W * scale[:, None]).T + bias with the packed 2:4 weight W:
// x [..., K] float32, float64, bfloat16 or float16, result [..., N] in x's
// dtype, bias [N] of x's dtype or undefined. Float values must have x's
// dtype; int8 values take any of those activations (W8A16). Products are
// summed in float32 (in float64 for float64 x, whatever the values) and
// each channel's sum is scaled once: y[m, n] = scale[n] * sum_k x[m, k] * W[n, k] +
// bias[n], rounded to x's dtype. Inference op: no derivative; called on
// tensors that require grad with grad mode on it raises.
at::Tensor sparse_2_4_linear(const at::Tensor& input, const at::Tensor& values,
                             const at::Tensor& meta, const at::Tensor& scale,
                             const std::optional<at::Tensor>& bias = std::nullopt);
// W8A8 dynamic with the packed 2:4 int8 weight (values int8 from pack_2_4
// of an int8 weight, colsum int32 [N] = values.sum(1)), activations per row
// (int8_dynamic_linear quantizes them per block of 32 along K). Each row of x [..., K] (float32,
// float64, bfloat16 or float16) is quantized per token as quantize_per_token_int8 does, the int8
// products of the kept weights are summed exactly in int32, and y[m, n] = (acc[m, n] * x_scale[m])
// * scale[n] + bias[n] in float32 (float64 for float64 x), rounded to x's dtype. K at most 132104;
// a row holding Inf or NaN gives a row of NaN. Inference op.
at::Tensor sparse_2_4_dynamic_linear(const at::Tensor& input, const at::Tensor& values,
                                     const at::Tensor& meta, const at::Tensor& scale,
                                     const at::Tensor& colsum,
                                     const std::optional<at::Tensor>& bias = std::nullopt);

}  // namespace fuseops
