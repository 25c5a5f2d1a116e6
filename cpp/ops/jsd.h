#pragma once
// The contract of jsd between its shared entry points and its kernels (see
// ops/relu.h): one row kernel, which each backend registers, computes the
// loss and row statistics of the forward or the gradient of the backward.

#include <optional>
#include <string_view>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "ops/common/linear_loss.h"
#include "ops_generated/jsd.h"

namespace fuseops::detail {

enum class JsdReduction { None, Sum, Mean, BatchMean };

// Which divergence beta selects: its two ends are the plain KL divergences
// (not the limits of the mixture's, which vanish there).
enum class JsdMode { ForwardKl, ReverseKl, Mixture };

inline JsdMode jsd_mode(double beta) {
  return beta == 0.0 ? JsdMode::ForwardKl : beta == 1.0 ? JsdMode::ReverseKl : JsdMode::Mixture;
}

struct JsdOptions {
  double beta;
  double temperature;
  int64_t ignore_index;
};

// The row kernel over rows of length V. With s = student / T - lse_s,
// t = teacher / T - lse_t (log-softmax rows), p = exp(s), q = exp(t) and, for
// the mixture, m = log(beta q + (1 - beta) p) = logaddexp(t + log beta,
// s + log(1 - beta)), K_s = sum p (s - m), K_t = sum q (t - m), a counted
// row's loss is
//   forward KL: sum q (t - s);  reverse KL: sum p (s - t);
//   mixture: beta K_t + (1 - beta) K_s,
// and its gradient with respect to the student's logits, times grad_scale,
//   forward KL: (p - q) / T;  reverse KL: p (s - t - loss) / T;
//   mixture: (1 - beta) p (s - m - K_s) / T.
// Terms with p (or q) = 0 are 0 (the limit of p log p), so that -Inf logits
// (masked classes) give finite losses. Ignored rows have loss, row_stats and
// gradient 0.
// When `loss` is defined the kernel writes the loss and row_stats (lse_s,
// lse_t, K_s; K_s is the loss for reverse KL, 0 for forward KL); otherwise it
// reads row_stats and writes `grad`. Every tensor is contiguous; kernels
// never see an empty row set.
struct JsdRowsArgs {
  at::Tensor loss;        // [N] opmath, or undefined
  at::Tensor row_stats;   // [N, 3] opmath: written with `loss`, else read
  at::Tensor grad;        // [N, V] logits' dtype, or undefined
  at::Tensor grad_scale;  // opmath, [N] (per row) or 0-d (every row); with `grad`
  at::Tensor student;     // [N, V]
  at::Tensor teacher;     // [N, V], student's dtype
  at::Tensor label;       // [N] int64, or undefined (every row counts)
  JsdOptions options;
};

using JsdRowsKernel = void (*)(const JsdRowsArgs& args);

// Checks, layout and allocation common to every backend; the kernel fills
// the outputs (nullptr for the Meta backend, which only needs shapes).
std::tuple<at::Tensor, at::Tensor> jsd_forward_with(
    const char* op, const at::Tensor& student_logits, const at::Tensor& teacher_logits,
    const std::optional<at::Tensor>& label, double beta, double temperature, int64_t ignore_index,
    std::string_view reduction, JsdRowsKernel kernel);
at::Tensor jsd_backward_with(const at::Tensor& grad_output, const at::Tensor& student_logits,
                             const at::Tensor& teacher_logits,
                             const std::optional<at::Tensor>& label, const at::Tensor& row_stats,
                             double beta, double temperature, int64_t ignore_index,
                             std::string_view reduction, JsdRowsKernel kernel);

// What fused_linear_jsd_with computes: the loss (a scalar, or [N] for
// reduction "none") and the gradients of student_input and student_weight
// (empty when not asked for).
struct FusedLinearJsdResult {
  at::Tensor loss;
  at::Tensor grad_input;
  at::Tensor grad_weight;
};

// jsd of student_input @ student_weight^T and teacher_input @
// teacher_weight^T, rows in chunks: each chunk's logits are formed by GEMMs
// (at::mm, any device), go through the row kernel (loss and statistics, then
// the student's gradient), and its gradient through two more GEMMs.
FusedLinearJsdResult fused_linear_jsd_with(const char* op, const at::Tensor& student_input,
                                           const at::Tensor& student_weight,
                                           const at::Tensor& teacher_input,
                                           const at::Tensor& teacher_weight,
                                           const std::optional<at::Tensor>& label, double beta,
                                           double temperature, int64_t ignore_index,
                                           std::string_view reduction, LinearLossGradient gradient,
                                           const at::Tensor& grad_output, JsdRowsKernel kernel);

// The dispatcher entry points of one backend, whose `Kernels::rows()`
// returns its kernel.
template <typename Kernels>
struct JsdRegistrations {
  static at::Tensor jsd(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
                        const std::optional<at::Tensor>& label, double beta, double temperature,
                        int64_t ignore_index, std::string_view reduction) {
    return std::get<0>(jsd_forward_with("fuseops::jsd", student_logits, teacher_logits, label, beta,
                                        temperature, ignore_index, reduction, Kernels::rows()));
  }
  static std::tuple<at::Tensor, at::Tensor> jsd_forward(const at::Tensor& student_logits,
                                                        const at::Tensor& teacher_logits,
                                                        const std::optional<at::Tensor>& label,
                                                        double beta, double temperature,
                                                        int64_t ignore_index,
                                                        std::string_view reduction) {
    return jsd_forward_with("fuseops::jsd_forward", student_logits, teacher_logits, label, beta,
                            temperature, ignore_index, reduction, Kernels::rows());
  }
  static at::Tensor jsd_backward(const at::Tensor& grad_output, const at::Tensor& student_logits,
                                 const at::Tensor& teacher_logits,
                                 const std::optional<at::Tensor>& label,
                                 const at::Tensor& row_stats, double beta, double temperature,
                                 int64_t ignore_index, std::string_view reduction) {
    return jsd_backward_with(grad_output, student_logits, teacher_logits, label, row_stats, beta,
                             temperature, ignore_index, reduction, Kernels::rows());
  }

  static at::Tensor fused_linear_jsd(const at::Tensor& student_input,
                                     const at::Tensor& student_weight,
                                     const at::Tensor& teacher_input,
                                     const at::Tensor& teacher_weight,
                                     const std::optional<at::Tensor>& label, double beta,
                                     double temperature, int64_t ignore_index,
                                     std::string_view reduction) {
    return fused_linear_jsd_with("fuseops::fused_linear_jsd", student_input, student_weight,
                                 teacher_input, teacher_weight, label, beta, temperature,
                                 ignore_index, reduction, LinearLossGradient::None, at::Tensor(),
                                 Kernels::rows())
        .loss;
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_linear_jsd_forward(
      const at::Tensor& student_input, const at::Tensor& student_weight,
      const at::Tensor& teacher_input, const at::Tensor& teacher_weight,
      const std::optional<at::Tensor>& label, double beta, double temperature, int64_t ignore_index,
      std::string_view reduction) {
    auto r =
        fused_linear_jsd_with("fuseops::fused_linear_jsd_forward", student_input, student_weight,
                              teacher_input, teacher_weight, label, beta, temperature, ignore_index,
                              reduction, LinearLossGradient::OfOne, at::Tensor(), Kernels::rows());
    return {r.loss, r.grad_input, r.grad_weight};
  }
  static std::tuple<at::Tensor, at::Tensor> fused_linear_jsd_backward(
      const at::Tensor& grad_output, const at::Tensor& student_input,
      const at::Tensor& student_weight, const at::Tensor& teacher_input,
      const at::Tensor& teacher_weight, const std::optional<at::Tensor>& label, double beta,
      double temperature, int64_t ignore_index, std::string_view reduction) {
    auto r = fused_linear_jsd_with("fuseops::fused_linear_jsd_backward", student_input,
                                   student_weight, teacher_input, teacher_weight, label, beta,
                                   temperature, ignore_index, reduction,
                                   LinearLossGradient::OfGradOutput, grad_output, Kernels::rows());
    return {r.grad_input, r.grad_weight};
  }

  // The operators of cpp/ops/jsd.yaml's `ops:`, each with the function of
  // the same name.
  template <typename Library>
  static void register_all(Library& m) {
    register_jsd_kernels<JsdRegistrations>(m);
  }
};

}  // namespace fuseops::detail
