#pragma once

#include <optional>
#include <string_view>
#include <tuple>

#include <ATen/core/Tensor.h>

namespace fuseops {

// Softmax + cross-entropy over the last dimension of `logits` ([..., V],
// float32/float64/bfloat16/float16) against class indices `target` ([...],
// int64 or int32), as torch.nn.functional.cross_entropy with the class
// dimension last: `weight` ([V], per class), `reduction` "none" | "sum" |
// "mean" (mean divides by the summed weights of the non-ignored targets, NaN
// when every target is ignored), `ignore_index`, `label_smoothing`. Two
// extensions: `z_loss` adds z_loss * logsumexp(z)^2 to every non-ignored
// row, and `softcap` c replaces the logits by z = c * tanh(logits / c) first
// (gradient through the tanh). Computed in float32 (float64 for float64);
// the loss has logits' dtype. A target outside [0, V) that is not
// ignore_index is an error. Differentiable in logits (C++ autograd).
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                         const std::optional<at::Tensor>& weight = std::nullopt,
                         std::string_view reduction = "mean", int64_t ignore_index = -100,
                         double label_smoothing = 0.0, double z_loss = 0.0,
                         std::optional<double> softcap = std::nullopt);

// cross_entropy that also returns what cross_entropy_backward needs:
// (loss, lse, total_weight), lse = logsumexp(z) per row (shape
// target.shape, float32; float64 for float64 logits; 0 for ignored rows) and
// total_weight the summed weights of the non-ignored targets (0-d, same
// dtype; the mean's divisor, kept on the device).
std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy_forward(
    const at::Tensor& logits, const at::Tensor& target,
    const std::optional<at::Tensor>& weight = std::nullopt, std::string_view reduction = "mean",
    int64_t ignore_index = -100, double label_smoothing = 0.0, double z_loss = 0.0,
    std::optional<double> softcap = std::nullopt);

// Gradient of cross_entropy with respect to logits, in one pass over them:
// the softmax is recomputed from logits and lse. grad_output has the loss's
// shape (target.shape for "none", 0-d otherwise).
at::Tensor cross_entropy_backward(const at::Tensor& grad_output, const at::Tensor& logits,
                                  const at::Tensor& target, const std::optional<at::Tensor>& weight,
                                  const at::Tensor& lse, const at::Tensor& total_weight,
                                  std::string_view reduction, int64_t ignore_index,
                                  double label_smoothing, double z_loss,
                                  std::optional<double> softcap);

// cross_entropy that saves the [..., V] gradient allocation: the forward
// writes the gradient of the loss (for a grad_output of 1) into `logits`
// itself, and the backward scales that buffer by grad_output in place and
// returns it. Contract: the values of `logits` are gone after the call (it
// holds the gradient), nothing else may read them, and the backward runs at
// most once. A non-contiguous `logits` is written through a contiguous copy.
// Differentiable in logits.
at::Tensor cross_entropy_inplace(at::Tensor& logits, const at::Tensor& target,
                                 const std::optional<at::Tensor>& weight = std::nullopt,
                                 std::string_view reduction = "mean", int64_t ignore_index = -100,
                                 double label_smoothing = 0.0, double z_loss = 0.0,
                                 std::optional<double> softcap = std::nullopt);

// cross_entropy(input @ weight.T + bias, target, ...) without the [N, V]
// logits: input [N, H], weight [V, H], bias [V], target [N]. Tokens are
// taken in chunks whose logits are about 4 times the size of `input` (at
// least 64 rows); each chunk's logits are one GEMM into a reused
// buffer, overwritten by their gradient by the cross-entropy row kernel, and
// turned into the chunk's grad_input rows and a float32 accumulation of
// grad_weight and grad_bias by two more GEMMs.
// For reduction "mean" or "sum" the gradients are computed in the forward
// (when one will be needed) and only scaled by grad_output in the backward;
// for "none" (a loss per row, [N]) the backward recomputes the logits chunk
// by chunk (linear_cross_entropy_backward): one GEMM more. With "sum",
// `normalizer` divides the loss (and its gradients), for gradient
// accumulation over micro-batches. Differentiable in input, weight and bias.
at::Tensor linear_cross_entropy(const at::Tensor& input, const at::Tensor& weight,
                                const std::optional<at::Tensor>& bias, const at::Tensor& target,
                                const std::optional<at::Tensor>& class_weight = std::nullopt,
                                std::string_view reduction = "mean", int64_t ignore_index = -100,
                                double label_smoothing = 0.0, double z_loss = 0.0,
                                std::optional<double> softcap = std::nullopt,
                                std::optional<double> normalizer = std::nullopt);

// linear_cross_entropy with what the same pass also yields: (loss, lse,
// predicted, softmax_stats), lse the per-row logsumexp of the (softcapped)
// logits ([N], float32; float64 for float64 input; 0 on ignored rows: the
// z-loss term of a row is z_loss * lse^2), predicted the argmax of each
// row's logits ([N] int64, the first of equal maxima; empty unless
// `predict`), softmax_stats per row of z = softcap(logits), p = softmax(z):
// the entropy -sum p log p, the mean logit sum z / V and log sum p^2 ([N, 3]
// in lse's dtype, 0 on ignored rows; [0, 3] unless `softmax_stats`, which
// costs one more read of each chunk's logits). Differentiable in the loss
// only, with linear_cross_entropy's backward (for reduction "none" with a
// frozen head, weight and bias not requiring gradients, the forward computes
// each row's input gradient and the backward scales it: no recomputation).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_stats(
    const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const at::Tensor& target, const std::optional<at::Tensor>& class_weight = std::nullopt,
    std::string_view reduction = "mean", int64_t ignore_index = -100, double label_smoothing = 0.0,
    double z_loss = 0.0, std::optional<double> softcap = std::nullopt,
    std::optional<double> normalizer = std::nullopt, bool predict = false,
    bool softmax_stats = false);

// linear_cross_entropy's loss and its gradients for a grad_output of 1 (of
// ones for reduction "none": then grad_input's row i is the gradient of
// loss i alone), then lse, predicted and softmax_stats as
// linear_cross_entropy_stats gives them: (loss, grad_input, grad_weight,
// grad_bias, lse, predicted, softmax_stats); grad_bias is empty without
// bias, grad_weight and grad_bias are empty without `weight_grad` (a frozen
// head: one GEMM less per chunk).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
linear_cross_entropy_forward(const at::Tensor& input, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias, const at::Tensor& target,
                             const std::optional<at::Tensor>& class_weight = std::nullopt,
                             std::string_view reduction = "mean", int64_t ignore_index = -100,
                             double label_smoothing = 0.0, double z_loss = 0.0,
                             std::optional<double> softcap = std::nullopt,
                             std::optional<double> normalizer = std::nullopt, bool predict = false,
                             bool weight_grad = true, bool softmax_stats = false);

// The gradients (grad_input, grad_weight, grad_bias) of linear_cross_entropy
// for `grad_output` of the loss's shape ([N] for reduction "none"; a per-row
// grad_output is also a per-token weighting of the losses), recomputing the
// logits chunk by chunk; grad_bias is empty without bias. Not differentiable.
std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, const at::Tensor& target,
    const std::optional<at::Tensor>& class_weight, std::string_view reduction, int64_t ignore_index,
    double label_smoothing, double z_loss, std::optional<double> softcap,
    std::optional<double> normalizer);

}  // namespace fuseops
