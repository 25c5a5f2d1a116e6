#pragma once
// The contract of cross_entropy and linear_cross_entropy between their shared
// entry points and their kernels (see ops/relu.h). Both ops share one family:
// linear_cross_entropy is a composite of GEMMs (at::mm, any device) and the
// very row kernel of cross_entropy, which each backend registers once.

#include <optional>
#include <string_view>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "ops/common/linear_loss.h"
#include "ops_generated/cross_entropy.h"

namespace fuseops::detail {

enum class Reduction { None, Sum, Mean };

// The reduction named by a `reduction` argument; anything else is an error
// naming `op`.
Reduction parse_reduction(const char* op, std::string_view reduction);

struct CrossEntropyOptions {
  int64_t ignore_index;
  double label_smoothing;
  double z_loss;
  double softcap;  // 0: none
};

// Row weights of the targets: row_weight[i] = weight[target[i]] (1 without
// weight), 0 where target[i] == ignore_index. A target outside [0, vocab)
// that is not ignore_index is an error naming `op` and the value (CPU: an
// exception; CUDA: a device-side assert; never an out-of-bounds read).
struct CrossEntropyTargetArgs {
  at::Tensor row_weight;  // [N] opmath
  at::Tensor target;      // [N] int64
  at::Tensor weight;      // [V] opmath, or undefined
  int64_t vocab;
  int64_t ignore_index;
  const char* op;
};

// The row kernel, over rows of length V of `logits`. With z = softcap(logits)
// and lse = logsumexp(z), the loss of a non-ignored row i with target t is
//   (1 - s) w_t (lse - z_t) + (s / V) sum_c w_c (lse - z_c) + z_loss lse^2
// (s = label_smoothing, w the class weights or ones), and its gradient
//   d/dz_c = p_c A - (s / V) w_c - [c == t] (1 - s) w_t,
//   A = (1 - s) w_t + (s / V) sum_c w_c + 2 z_loss lse, p = softmax(z),
// times grad_scale and the softcap's 1 - (z_c / cap)^2. Ignored rows have
// loss, lse and gradient 0.
// When `loss` is defined the kernel computes lse and the loss (one read of
// the row: online max and sum; label smoothing's sum of z reads it again
// from cache), then, if `grad` is defined, the gradient in a pass that reads
// and writes the row once; when `loss` is undefined it reads `lse` and
// only writes the gradient. `grad` may be `logits` itself (each row is read
// whole before it is written). Every tensor is contiguous; kernels never see
// an empty `logits`.
struct CrossEntropyRowsArgs {
  at::Tensor loss;        // [N] opmath, or undefined
  at::Tensor lse;         // [N] opmath: written with `loss`, else read
  at::Tensor grad;        // [N, V] logits' dtype, or undefined
  at::Tensor grad_scale;  // opmath, [N] (per row) or 0-d (every row); with `grad`
  at::Tensor logits;      // [N, V]
  at::Tensor target;      // [N] int64 (checked by the target kernel)
  at::Tensor row_weight;  // [N] opmath, from the target kernel
  at::Tensor weight;      // [V] opmath, or undefined
  at::Tensor weight_sum;  // 0-d opmath: sum of `weight`, defined with it
  CrossEntropyOptions options;
};

using CrossEntropyTargetKernel = void (*)(const CrossEntropyTargetArgs& args);
using CrossEntropyRowsKernel = void (*)(const CrossEntropyRowsArgs& args);

// Checks, layout and allocation common to every backend; the kernels fill
// the outputs (nullptr for the Meta backend, which only needs shapes).
std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy_forward_with(
    const char* op, const at::Tensor& logits, const at::Tensor& target,
    const std::optional<at::Tensor>& weight, std::string_view reduction, int64_t ignore_index,
    double label_smoothing, double z_loss, std::optional<double> softcap,
    CrossEntropyTargetKernel target_kernel, CrossEntropyRowsKernel rows_kernel);
at::Tensor cross_entropy_backward_with(
    const at::Tensor& grad_output, const at::Tensor& logits, const at::Tensor& target,
    const std::optional<at::Tensor>& weight, const at::Tensor& lse, const at::Tensor& total_weight,
    std::string_view reduction, int64_t ignore_index, double label_smoothing, double z_loss,
    std::optional<double> softcap, CrossEntropyTargetKernel target_kernel,
    CrossEntropyRowsKernel rows_kernel);
at::Tensor cross_entropy_inplace_with(at::Tensor& logits, const at::Tensor& target,
                                      const std::optional<at::Tensor>& weight,
                                      std::string_view reduction, int64_t ignore_index,
                                      double label_smoothing, double z_loss,
                                      std::optional<double> softcap,
                                      CrossEntropyTargetKernel target_kernel,
                                      CrossEntropyRowsKernel rows_kernel);
// What linear_cross_entropy_with computes: the loss (a scalar, or [N] for
// reduction "none"), the per-row logsumexp of the (softcapped) logits
// ([N] opmath, 0 on ignored rows), the predicted class of every row (argmax
// of the logits, [N] int64, or empty when not asked for), the softmax
// statistics of every row ([N, 3] opmath: entropy, mean logit, log of the
// summed squared probabilities, of the softcapped logits; 0 on ignored rows;
// [0, 3] when not asked for) and the gradients (empty when not asked for;
// grad_bias also empty without a bias).
struct LinearCrossEntropyResult {
  at::Tensor loss;
  at::Tensor lse;
  at::Tensor predicted;
  at::Tensor softmax_stats;
  at::Tensor grad_input;
  at::Tensor grad_weight;
  at::Tensor grad_bias;
};

LinearCrossEntropyResult linear_cross_entropy_with(
    const char* op, const at::Tensor& input, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, const at::Tensor& target,
    const std::optional<at::Tensor>& class_weight, std::string_view reduction, int64_t ignore_index,
    double label_smoothing, double z_loss, std::optional<double> softcap,
    std::optional<double> normalizer, LinearLossGradient gradient, const at::Tensor& grad_output,
    bool predict, bool softmax_stats, CrossEntropyTargetKernel target_kernel,
    CrossEntropyRowsKernel rows_kernel);

// The dispatcher entry points of one backend, whose `Kernels::target()` and
// `Kernels::rows()` return its kernels.
template <typename Kernels>
struct CrossEntropyRegistrations {
  static at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                                  const std::optional<at::Tensor>& weight,
                                  std::string_view reduction, int64_t ignore_index,
                                  double label_smoothing, double z_loss,
                                  std::optional<double> softcap) {
    return std::get<0>(cross_entropy_forward_with("fuseops::cross_entropy", logits, target, weight,
                                                  reduction, ignore_index, label_smoothing, z_loss,
                                                  softcap, Kernels::target(), Kernels::rows()));
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy_forward(
      const at::Tensor& logits, const at::Tensor& target, const std::optional<at::Tensor>& weight,
      std::string_view reduction, int64_t ignore_index, double label_smoothing, double z_loss,
      std::optional<double> softcap) {
    return cross_entropy_forward_with("fuseops::cross_entropy_forward", logits, target, weight,
                                      reduction, ignore_index, label_smoothing, z_loss, softcap,
                                      Kernels::target(), Kernels::rows());
  }
  static at::Tensor cross_entropy_backward(const at::Tensor& grad_output, const at::Tensor& logits,
                                           const at::Tensor& target,
                                           const std::optional<at::Tensor>& weight,
                                           const at::Tensor& lse, const at::Tensor& total_weight,
                                           std::string_view reduction, int64_t ignore_index,
                                           double label_smoothing, double z_loss,
                                           std::optional<double> softcap) {
    return cross_entropy_backward_with(grad_output, logits, target, weight, lse, total_weight,
                                       reduction, ignore_index, label_smoothing, z_loss, softcap,
                                       Kernels::target(), Kernels::rows());
  }
  static at::Tensor cross_entropy_inplace(at::Tensor& logits, const at::Tensor& target,
                                          const std::optional<at::Tensor>& weight,
                                          std::string_view reduction, int64_t ignore_index,
                                          double label_smoothing, double z_loss,
                                          std::optional<double> softcap) {
    return cross_entropy_inplace_with(logits, target, weight, reduction, ignore_index,
                                      label_smoothing, z_loss, softcap, Kernels::target(),
                                      Kernels::rows());
  }
  static at::Tensor linear_cross_entropy(
      const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
      const at::Tensor& target, const std::optional<at::Tensor>& class_weight,
      std::string_view reduction, int64_t ignore_index, double label_smoothing, double z_loss,
      std::optional<double> softcap, std::optional<double> normalizer) {
    return linear_cross_entropy_with("fuseops::linear_cross_entropy", input, weight, bias, target,
                                     class_weight, reduction, ignore_index, label_smoothing, z_loss,
                                     softcap, normalizer, LinearLossGradient::None, at::Tensor(),
                                     /*predict=*/false, /*softmax_stats=*/false, Kernels::target(),
                                     Kernels::rows())
        .loss;
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_stats(
      const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
      const at::Tensor& target, const std::optional<at::Tensor>& class_weight,
      std::string_view reduction, int64_t ignore_index, double label_smoothing, double z_loss,
      std::optional<double> softcap, std::optional<double> normalizer, bool predict,
      bool softmax_stats) {
    auto r = linear_cross_entropy_with(
        "fuseops::linear_cross_entropy_stats", input, weight, bias, target, class_weight, reduction,
        ignore_index, label_smoothing, z_loss, softcap, normalizer, LinearLossGradient::None,
        at::Tensor(), predict, softmax_stats, Kernels::target(), Kernels::rows());
    return {r.loss, r.lse, r.predicted, r.softmax_stats};
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                    at::Tensor>
  linear_cross_entropy_forward(const at::Tensor& input, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias, const at::Tensor& target,
                               const std::optional<at::Tensor>& class_weight,
                               std::string_view reduction, int64_t ignore_index,
                               double label_smoothing, double z_loss, std::optional<double> softcap,
                               std::optional<double> normalizer, bool predict, bool weight_grad,
                               bool softmax_stats) {
    auto r = linear_cross_entropy_with(
        "fuseops::linear_cross_entropy_forward", input, weight, bias, target, class_weight,
        reduction, ignore_index, label_smoothing, z_loss, softcap, normalizer,
        weight_grad ? LinearLossGradient::OfOne : LinearLossGradient::InputOfOne, at::Tensor(),
        predict, softmax_stats, Kernels::target(), Kernels::rows());
    return {r.loss, r.grad_input, r.grad_weight, r.grad_bias, r.lse, r.predicted, r.softmax_stats};
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_backward(
      const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
      const std::optional<at::Tensor>& bias, const at::Tensor& target,
      const std::optional<at::Tensor>& class_weight, std::string_view reduction,
      int64_t ignore_index, double label_smoothing, double z_loss, std::optional<double> softcap,
      std::optional<double> normalizer) {
    auto r = linear_cross_entropy_with(
        "fuseops::linear_cross_entropy_backward", input, weight, bias, target, class_weight,
        reduction, ignore_index, label_smoothing, z_loss, softcap, normalizer,
        LinearLossGradient::OfGradOutput, grad_output,
        /*predict=*/false, /*softmax_stats=*/false, Kernels::target(), Kernels::rows());
    return {r.grad_input, r.grad_weight, r.grad_bias};
  }

  // The operators of cpp/ops/cross_entropy.yaml's `ops:`, each with the function of
  // the same name.
  template <typename Library>
  static void register_all(Library& m) {
    register_cross_entropy_kernels<CrossEntropyRegistrations>(m);
  }
};

}  // namespace fuseops::detail
