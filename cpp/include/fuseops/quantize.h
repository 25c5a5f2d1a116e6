#pragma once

#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>

namespace fuseops {

// Symmetric int8 quantization: each row (the last dimension) gets one
// float32 scale, scale = absmax(row) / 127, and q = round(x / scale) to
// nearest, ties to even, in [-127, 127]. The arithmetic is float32 for every
// input dtype (float64 inputs are rounded to float32 first: eight bits make
// the difference moot). A row whose absmax / 127 is 0 in float32 (all zeros,
// or only values below about 1.8e-43) gets scale 1 and quantizes to zeros,
// so dequantization gives 0, never NaN. A row holding Inf or NaN (or, in
// float64, a value beyond float32's range) is refused with an error naming
// the row. Inference ops: no derivative; called on tensors that require
// grad with grad mode on they raise.

// Per-output-channel quantization of a linear layer's weight [N, K]:
// returns (q int8 [N, K], scale float32 [N]).
std::tuple<at::Tensor, at::Tensor> quantize_per_channel_int8(const at::Tensor& weight);

// Per-token quantization of activations [..., K]: returns
// (q int8 [..., K], scale float32 [...]).
std::tuple<at::Tensor, at::Tensor> quantize_per_token_int8(const at::Tensor& input);

// q * scale, with one scale per slice along `dim` (the dimension each scale
// covers, reduced when quantizing): scale has q's shape without `dim`.
// The product is computed in float32 (float64 for a float64 result) and
// rounded to `dtype` (default float32).
at::Tensor dequantize_int8(const at::Tensor& q, const at::Tensor& scale, int64_t dim = -1,
                           std::optional<at::ScalarType> dtype = std::nullopt);

}  // namespace fuseops
