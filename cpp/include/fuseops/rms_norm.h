#pragma once

#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>

namespace fuseops {

// RMSNorm over the last dimension, as torch.nn.functional.rms_norm(input,
// (input.size(-1),), weight, eps):
//   out = input / sqrt(mean(input^2, -1) + eps) * weight
// computed in float32 for bfloat16/float16 (float64 for float64) and rounded
// once. `weight` has shape (input.size(-1),) and any floating dtype; the
// result has input's dtype. eps defaults, as in PyTorch, to the machine
// epsilon of the computation type (float32's, or float64's for float64).
// Differentiable (C++ autograd) in input and weight.
at::Tensor rms_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight = std::nullopt,
                    std::optional<double> eps = std::nullopt);

// rms_norm into a preallocated `out` (resized to input's shape if it
// differs). Not differentiable, like every out= op.
at::Tensor& rms_norm_out(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                         std::optional<double> eps, at::Tensor& out);

// rms_norm that also returns rstd = 1 / sqrt(mean(input^2, -1) + eps) per row
// (shape input.shape[:-1], float32, or float64 for float64 input): what
// rms_norm_backward needs. Differentiable in input and weight (not in rstd).
std::tuple<at::Tensor, at::Tensor> rms_norm_forward(
    const at::Tensor& input, const std::optional<at::Tensor>& weight = std::nullopt,
    std::optional<double> eps = std::nullopt);

// Gradients of rms_norm w.r.t. input and weight, in one pass over the rows
// (the weight gradient accumulates in float32/float64 across all rows).
// grad_weight has weight's dtype, or is an empty tensor when weight is None.
std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad_output,
                                                     const at::Tensor& input,
                                                     const std::optional<at::Tensor>& weight,
                                                     const at::Tensor& rstd);

// rms_norm_backward into preallocated tensors (grad_weight resized to
// [hidden], or [0] without weight); grad_input may be grad_output or input
// itself (computed in place). Not differentiable, like every out= op.
void rms_norm_backward_out(const at::Tensor& grad_output, const at::Tensor& input,
                           const std::optional<at::Tensor>& weight, const at::Tensor& rstd,
                           at::Tensor& grad_input, at::Tensor& grad_weight);

// Residual add + RMSNorm in one pass over memory (the pre-norm transformer
// block): new_residual = input + residual (computed in float32, stored in the
// dtype), out = rms_norm(new_residual, weight, eps). Returns
// (out, new_residual). Differentiable in input, residual and weight.
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(
    const at::Tensor& input, const at::Tensor& residual,
    const std::optional<at::Tensor>& weight = std::nullopt,
    std::optional<double> eps = std::nullopt);

// fused_add_rms_norm into preallocated `out` and `residual_out`. Either may
// be the very tensor `input` or `residual` (in place, as inference engines
// update the residual stream). Not differentiable.
std::tuple<at::Tensor&, at::Tensor&> fused_add_rms_norm_out(
    const at::Tensor& input, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    std::optional<double> eps, at::Tensor& out, at::Tensor& residual_out);

// fused_add_rms_norm that also returns rstd: (out, new_residual, rstd).
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_forward(
    const at::Tensor& input, const at::Tensor& residual,
    const std::optional<at::Tensor>& weight = std::nullopt,
    std::optional<double> eps = std::nullopt);

// Gradients of fused_add_rms_norm: (grad_input, grad_weight), where
// grad_input, the gradient of new_residual from both of its uses
// (rms_norm_backward's input gradient + grad_new_residual), is also the
// gradient of `residual`. grad_new_residual may be undefined (unused output).
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_backward(
    const at::Tensor& grad_output, const std::optional<at::Tensor>& grad_new_residual,
    const at::Tensor& new_residual, const std::optional<at::Tensor>& weight,
    const at::Tensor& rstd);

// fused_add_rms_norm_backward into preallocated tensors (grad_weight resized
// to {H}, or {0} without a weight); grad_input may be grad_output,
// grad_new_residual or new_residual itself (computed in place). Not
// differentiable, like every out= op.
void fused_add_rms_norm_backward_out(const at::Tensor& grad_output,
                                     const std::optional<at::Tensor>& grad_new_residual,
                                     const at::Tensor& new_residual,
                                     const std::optional<at::Tensor>& weight,
                                     const at::Tensor& rstd, at::Tensor& grad_input,
                                     at::Tensor& grad_weight);

}  // namespace fuseops
