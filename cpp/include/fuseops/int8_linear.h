#pragma once

#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>

namespace fuseops {

// Packs a per-channel int8 weight (from quantize_per_channel_int8) into the
// layout of the int8 linear kernels. Returns three plain tensors, so a
// module can keep them as buffers (state_dict, torch.compile and
// torch.export see ordinary tensors):
//
//   packed  int8 [ceil(N/16), ceil(K/4), 16, 4]:
//           packed[b, g, c, j] = wq[16*b + c, 4*g + j], 0 past N or K.
//           Blocks of 16 output channels; inside a block, K in groups of 4
//           consecutive values per channel (the VNNI order of vpdpbusd, 64
//           bytes per group), so a kernel streams one block contiguously.
//   scale   float32 [N]: the per-channel scales, copied.
//   colsum  int16 [ceil(K/32), N]: colsum[b, n] = sum of wq[n, k] over
//           activation block b (k in [32b, 32b + 32), zeros past K), kept
//           for int8_dynamic_linear's kernels (unsigned activations x + 128
//           need -128 * colsum, block by block).
//
// N and K are not stored: N is scale's length, K the activations' last
// dimension (checked against the packed shape).
std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_int8_weight(const at::Tensor& wq,
                                                                const at::Tensor& scale);

// y = x @ (wq * scale[:, None]).T + bias with int8 weights and float
// activations (W8A16): x [..., K] float32, bfloat16, float16 or float64,
// the weight as pack_int8_weight returns it (packed, scale), bias [N] of x's
// dtype or undefined. Products are summed in float32 (float64 activations
// are rounded to float32) and the scale is applied once per output
// channel: y[m, n] = scale[n] * sum_k x[m, k] * wq[n, k] + bias[n], rounded
// to x's dtype. On CPUs with AVX512_BF16, bfloat16 activations with more
// than 6 rows are multiplied by vdpbf16ps, which treats denormals (below
// about 1.2e-38) as 0. Inference op: no derivative; called on tensors that
// require grad with grad mode on it raises.
at::Tensor int8_weight_only_linear(const at::Tensor& input, const at::Tensor& packed,
                                   const at::Tensor& scale,
                                   const std::optional<at::Tensor>& bias = std::nullopt);

// W8A8 dynamic: y = x @ (wq * scale[:, None]).T + bias with the activations
// quantized on the fly per activation block of 32 along K. x [..., K]
// float32, bfloat16, float16 or float64 (rounded to float32 first); each
// block b of a row gets x_scale[m, b] = absmax/127 and xq = round(x /
// x_scale) clamped to [-127, 127], exactly as quantize_per_token_int8
// computes them for a row (an all-zero block scale 1): llama.cpp's Q8_0
// activations, which keep an outlier channel from setting the step of a
// whole row. Each block's products xq * wq are summed exactly in int32 and
// folded, block after block, into a float32 accumulator,
//   acc = fma(x_scale[m, b], float(sum_b[m, n]), acc),
// then y[m, n] = acc * scale[n] + bias[n] in float32 (float64 for float64
// x), rounded to x's dtype. colsum is the third tensor pack_int8_weight
// returns. A row holding Inf or NaN gives a row of NaN. K has no limit.
// Inference op: no derivative; called on tensors that require grad with
// grad mode on it raises.
at::Tensor int8_dynamic_linear(const at::Tensor& input, const at::Tensor& packed,
                               const at::Tensor& scale, const at::Tensor& colsum,
                               const std::optional<at::Tensor>& bias = std::nullopt);

}  // namespace fuseops
