#pragma once

#include <cstdint>
#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>

namespace fuseops {

// Group-wise int4 quantization of a weight [N, K] (float32, bfloat16,
// float16 or float64; computed in float32, float64 rounded first): K is cut
// into groups of `group_size` consecutive values per output channel (the
// last group of a row may be shorter) and each group gets a float32 scale
// and an integer zero point, so that
//
//   w[n, k] ~= (wq[n, k] - zero[n, g]) * scale[n, g],  g = k / group_size,
//
// with wq in [0, 15]. Returns (wq uint8 [N, K], scale float32
// [N, ceil(K/group_size)], zero uint8 [N, ceil(K/group_size)]).
//   symmetric (the default): zero = 8 and scale = m / -8, where m is the
//     group's value of largest magnitude (the first if two tie), so m maps
//     exactly to -8 and the others round into [-8, 7] (llama.cpp's Q4_0
//     rule; the scale's sign is opposite to m's). An all-zero group gets
//     scale 1.
//   asymmetric: the range [lo, hi] = [min(min w, 0), max(max w, 0)] in 15
//     steps: scale = (hi - lo) / 15 (1 for an all-zero group), zero =
//     round(-lo / scale) clamped to [0, 15].
// Values are rounded half to even, wq = clamp(round(w / scale) + zero, 0, 15).
// A weight holding Inf or NaN raises.
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_per_group_int4(const at::Tensor& weight,
                                                                       int64_t group_size = 128,
                                                                       bool symmetric = true);

// Packs (wq, scale, zero) as quantize_per_group_int4 returns them into the
// layout of int4_weight_only_linear. Returns two plain tensors, so a module
// can keep them as buffers:
//
//   packed      uint8 [ceil(N/16), G * group_size / 2, 16], G the number of
//               groups: packed[b, p, c] = q(16b + c, 2p) | q(16b + c, 2p + 1) << 4,
//               q = wq past which (channels past N, K past its end) 0.
//               Blocks of 16 output channels; inside a block, K in pairs,
//               one byte per channel holding the pair's two values (low
//               nibble first), so a kernel streams one block contiguously
//               and a 16-byte load is two K positions of 16 channels.
//   scale_zero  float32 [G, 2, N]: scale_zero[g, 0, n] = scale[n, g],
//               scale_zero[g, 1, n] = zero[n, g] (as a float), so a group's
//               scales and zero points of 16 consecutive channels are one
//               vector each. The linear ops also take it in bfloat16
//               (scale_zero.to(kBFloat16): half its bytes, the scales
//               rounded to 8 bits; zero points 0-15 stay exact).
//
// N is scale_zero's last dimension; K is the activations' last dimension
// (checked against the packed shape); group_size is passed to the linear op.
std::tuple<at::Tensor, at::Tensor> pack_int4_weight(const at::Tensor& wq, const at::Tensor& scale,
                                                    const at::Tensor& zero, int64_t group_size);

// W4A16: y = x @ w.T + bias with w[n, k] = (q[n, k] - zero[n, g]) *
// scale[n, g] from the packed weight (packed, scale_zero, group_size as
// pack_int4_weight's). x [..., K] float32, bfloat16, float16 or float64,
// bias [N] of x's dtype or undefined. Computed in float32 (float64
// activations are rounded to float32), group by group: the products x * q
// summed, the zero point's share zero[n, g] * (the row's sum of activations
// over the group) taken off, the group's scale applied to the difference:
// y[m, n] = sum_g scale[n, g] * (sum_{k in g} x[m, k] * q[n, k] -
// zero[n, g] * sum_{k in g} x[m, k]) + bias[n], rounded to x's dtype. An
// infinite activation makes its row NaN (Inf - Inf in the zero points'
// share). Every CPU build returns the same bits. Inference op: no derivative; called on tensors
// that require grad with grad mode on it raises.
at::Tensor int4_weight_only_linear(const at::Tensor& input, const at::Tensor& packed,
                                   const at::Tensor& scale_zero, int64_t group_size,
                                   const std::optional<at::Tensor>& bias = std::nullopt);

// W4A8: int4_weight_only_linear's weights (the same packed layout) times
// activations quantized to int8 per row, as quantize_per_token_int8 does
// (x_scale[m] = absmax / 127, xq = round(x / x_scale), ties to even; a row
// holding Inf or NaN gives NaN), the products summed exactly in int32 per
// group, then in float32:
// y[m, n] = x_scale[m] * sum_g scale[n, g] * (sum_{k in g} xq[m, k] * q[n, k]
//           - zero[n, g] * sum_{k in g} xq[m, k]) + bias[n], rounded to x's
// dtype. What llama.cpp's Q4_0 x Q8_0 dot products do, with one activation
// scale per row instead of per 32 values: on CPUs with AVX512_VNNI the
// products take a quarter of the instructions of W4A16's, so a decode step
// (few rows) streams the weight at memory speed. Every CPU build returns the
// same bits. Inference op: no derivative.
at::Tensor int4_dynamic_linear(const at::Tensor& input, const at::Tensor& packed,
                               const at::Tensor& scale_zero, int64_t group_size,
                               const std::optional<at::Tensor>& bias = std::nullopt);

}  // namespace fuseops
