#pragma once

#include <optional>
#include <string_view>
#include <tuple>

#include <ATen/core/Tensor.h>

namespace fuseops {

// The generalized Jensen-Shannon divergence between the softmax distributions
// of `student_logits` and `teacher_logits` ([..., V], one dtype of float32,
// float64, bfloat16, float16) over their last dimension: the distillation
// loss of TRL's GKDTrainer.generalized_jsd_loss. With
// s = log_softmax(student / temperature), t = log_softmax(teacher /
// temperature), each row's loss is
//   beta == 0: sum exp(t) (t - s), the forward KL(teacher || student);
//   beta == 1: sum exp(s) (s - t), the reverse KL(student || teacher);
//   otherwise: beta KL(teacher || M) + (1 - beta) KL(student || M),
//              M = beta exp(t) + (1 - beta) exp(s) (log M by logaddexp).
// Rows whose `label` ([...], int64 or int32) is `ignore_index` count for
// nothing. `reduction`: "batchmean" (the sum over rows divided by the number
// of counted rows), "sum", "mean" (divided by counted rows * V, as
// torch.nn.functional.kl_div's "mean") or "none" (a loss per row, shape
// [...], 0 on ignored rows). With no counted row, "batchmean" and "mean" are
// 0 (with a zero gradient), as TRL's batchmean. Computed in float32 (float64
// for float64); the loss has the logits' dtype. Differentiable in
// student_logits (C++ autograd); the teacher is a constant: a
// teacher_logits that requires grad is refused.
at::Tensor jsd(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
               const std::optional<at::Tensor>& label = std::nullopt, double beta = 0.5,
               double temperature = 1.0, int64_t ignore_index = -100,
               std::string_view reduction = "batchmean");

// jsd that also returns what jsd_backward needs: (loss, row_stats),
// row_stats [N, 3] (N rows of V; float32, float64 for float64 logits) holding
// per row the logsumexp of student / temperature, that of teacher /
// temperature, and sum exp(s) (s - log M) (with M as in jsd: M = exp(t) for
// beta 1, where it is the row's loss, and 0 for beta 0); zeros on ignored
// rows.
std::tuple<at::Tensor, at::Tensor> jsd_forward(
    const at::Tensor& student_logits, const at::Tensor& teacher_logits,
    const std::optional<at::Tensor>& label = std::nullopt, double beta = 0.5,
    double temperature = 1.0, int64_t ignore_index = -100,
    std::string_view reduction = "batchmean");

// Gradient of jsd with respect to student_logits, in one pass over the
// logits from jsd_forward's row_stats. grad_output has the loss's shape.
// Not differentiable.
at::Tensor jsd_backward(const at::Tensor& grad_output, const at::Tensor& student_logits,
                        const at::Tensor& teacher_logits, const std::optional<at::Tensor>& label,
                        const at::Tensor& row_stats, double beta, double temperature,
                        int64_t ignore_index, std::string_view reduction);

// The KL divergence of the two softmax distributions: jsd with beta 0,
// KL(teacher || student), or with `reverse` beta 1, KL(student || teacher).
inline at::Tensor kl_div(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
                         const std::optional<at::Tensor>& label = std::nullopt,
                         double temperature = 1.0, int64_t ignore_index = -100,
                         std::string_view reduction = "batchmean", bool reverse = false) {
  return jsd(student_logits, teacher_logits, label, reverse ? 1.0 : 0.0, temperature, ignore_index,
             reduction);
}

// jsd of the logits of two linear layers (LM heads) without forming them:
// student logits student_input @ student_weight^T (student_input [N, Hs],
// student_weight [V, Hs]), teacher logits teacher_input @ teacher_weight^T
// ([N, Ht], [V, Ht]), all four in one dtype; `label` [N] and the options as
// in jsd. Rows go in chunks whose logits take about four times the memory
// of student_input (at least 64 rows), so the memory beyond
// the inputs and gradients is O(chunk x V), never [N, V]. Differentiable in
// student_input and student_weight (C++ autograd; student_weight's gradient
// accumulated in float32 over the chunks). With reduction "batchmean",
// "sum" or "mean" the gradients are computed in the forward and the
// backward scales them by grad_output, once; with "none" the backward
// recomputes the logits. The teacher is a constant: a teacher_input or
// teacher_weight that requires grad is refused.
at::Tensor fused_linear_jsd(const at::Tensor& student_input, const at::Tensor& student_weight,
                            const at::Tensor& teacher_input, const at::Tensor& teacher_weight,
                            const std::optional<at::Tensor>& label = std::nullopt,
                            double beta = 0.5, double temperature = 1.0,
                            int64_t ignore_index = -100, std::string_view reduction = "batchmean");

// fused_linear_jsd and its gradients for a grad_output of 1 (ones per row
// for reduction "none"): (loss, grad_student_input, grad_student_weight).
// Not differentiable.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_linear_jsd_forward(
    const at::Tensor& student_input, const at::Tensor& student_weight,
    const at::Tensor& teacher_input, const at::Tensor& teacher_weight,
    const std::optional<at::Tensor>& label = std::nullopt, double beta = 0.5,
    double temperature = 1.0, int64_t ignore_index = -100,
    std::string_view reduction = "batchmean");

// The gradients (grad_student_input, grad_student_weight) of
// fused_linear_jsd for grad_output of the loss's shape, recomputing the
// logits chunk by chunk. Not differentiable.
std::tuple<at::Tensor, at::Tensor> fused_linear_jsd_backward(
    const at::Tensor& grad_output, const at::Tensor& student_input,
    const at::Tensor& student_weight, const at::Tensor& teacher_input,
    const at::Tensor& teacher_weight, const std::optional<at::Tensor>& label, double beta,
    double temperature, int64_t ignore_index, std::string_view reduction);

}  // namespace fuseops
