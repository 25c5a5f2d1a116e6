#pragma once

#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>

namespace fuseops {

// Layer normalization over the last dimension of `input`, as
// torch.nn.functional.layer_norm(input, {H}, weight, bias, eps) with
// H = input.size(-1): (x - mean) / sqrt(var + eps) * weight + bias, with the
// biased variance of each row. `weight` and `bias` are optional, of shape {H}
// and input's dtype. bfloat16/float16 are computed in float32. Differentiable
// with respect to input, weight and bias (C++ autograd); the result is
// contiguous, with the shape of `input`.
at::Tensor layer_norm(const at::Tensor& input,
                      const std::optional<at::Tensor>& weight = std::nullopt,
                      const std::optional<at::Tensor>& bias = std::nullopt, double eps = 1e-5);

// layer_norm into a preallocated `out` (resized to input's shape if it
// differs); `out` may be `input` itself. Not differentiable, like every out= op.
at::Tensor& layer_norm_out(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, double eps, at::Tensor& out);

// layer_norm that also returns the per-row statistics layer_norm_backward
// takes: (out, mean, rstd) with rstd = 1 / sqrt(var + eps), both of shape
// input.shape[:-1] and dtype float32 (float64 for float64 input).
// Differentiable in input, weight and bias (mean and rstd are not).
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_forward(
    const at::Tensor& input, const std::optional<at::Tensor>& weight = std::nullopt,
    const std::optional<at::Tensor>& bias = std::nullopt, double eps = 1e-5);

// Gradients of layer_norm given the per-row `mean` and `rstd`
// (1 / sqrt(var + eps)) of `input`. Both have the shape input.shape[:-1] (as
// layer_norm_forward returns them) or input.shape[:-1] + [1] (as
// at::native_layer_norm does), and dtype float32, float64, bfloat16 or
// float16; they are used in float32 (float64 for float64 input). Statistics
// stored in bfloat16/float16 (at::native_layer_norm's on CPU for such input)
// carry their rounding into the gradients, as in ATen's own backward. Returns
// (grad_input, grad_weight, grad_bias); grad_weight = sum over rows of
// grad_output * x_hat and grad_bias = sum over rows of grad_output, both of
// shape {H} and computed in the same pass as grad_input, whether or not the
// forward had a weight or bias.
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const at::Tensor& mean, const at::Tensor& rstd);

// layer_norm_backward into preallocated tensors (grad_weight and grad_bias
// resized to {H}); grad_input may be grad_output or input itself (computed
// in place). Not differentiable, like every out= op.
void layer_norm_backward_out(const at::Tensor& grad_output, const at::Tensor& input,
                             const std::optional<at::Tensor>& weight, const at::Tensor& mean,
                             const at::Tensor& rstd, at::Tensor& grad_input,
                             at::Tensor& grad_weight, at::Tensor& grad_bias);

}  // namespace fuseops
