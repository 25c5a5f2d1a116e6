// Autograd for fuseops::cross_entropy and fuseops::linear_cross_entropy,
// registered in C++ so LibTorch programs get gradients without Python.
//
// cross_entropy keeps the per-row logsumexp and the mean's divisor; its
// backward recomputes the softmax from the logits in one pass and has no
// derivative of its own (autograd/no_derivative.h). The in-place variant and
// linear_cross_entropy with reduction "mean" or "sum" compute their gradients
// in the forward; their backward only scales them by grad_output, in place,
// so it may run once. linear_cross_entropy with reduction "none" recomputes
// the logits in its backward (linear_cross_entropy_backward).
// Neither op is differentiable in its class weights: a weight that requires
// grad is refused rather than given no gradient silently.

#include <string>
#include <tuple>
#include <vector>

#include <ATen/record_function.h>

#include <torch/library.h>

#include <fuseops/cross_entropy.h>

#include "ops/autograd/function.h"
#include "ops/autograd/no_derivative.h"
#include "ops/common/output_memory.h"
#include "ops/common/tensors.h"
#include "ops_generated/autograd/cross_entropy.h"

namespace fuseops {
namespace {

void check_weight_no_grad(const char* op, const char* arg,
                          const std::optional<at::Tensor>& weight) {
  TORCH_CHECK(!autograd_detail::records_grad({weight}), op, ": argument '", arg,
              "' requires grad, but the op is not differentiable with respect to it");
}

// The Autograd kernels cpp/ops/cross_entropy.yaml declares as functions.
struct Options {
  std::string reduction;
  int64_t ignore_index;
  double label_smoothing;
  double z_loss;
  std::optional<double> softcap;
};

void save_options(AutogradContext* ctx, const Options& o) {
  ctx->saved_data["reduction"] = o.reduction;
  ctx->saved_data["ignore_index"] = o.ignore_index;
  ctx->saved_data["label_smoothing"] = o.label_smoothing;
  ctx->saved_data["z_loss"] = o.z_loss;
  ctx->saved_data["softcap"] = o.softcap.has_value() ? c10::IValue(*o.softcap) : c10::IValue();
}

Options saved_options(AutogradContext* ctx) {
  const c10::IValue& softcap = ctx->saved_data["softcap"];
  return {ctx->saved_data["reduction"].toStringRef(), ctx->saved_data["ignore_index"].toInt(),
          ctx->saved_data["label_smoothing"].toDouble(), ctx->saved_data["z_loss"].toDouble(),
          softcap.isNone() ? std::nullopt : std::optional<double>(softcap.toDouble())};
}

class CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
 public:
  // Returns (loss, lse, total_weight); only the loss is differentiable.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits,
                               const at::Tensor& target, const std::optional<at::Tensor>& weight,
                               const Options& o) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [loss, lse, total_weight] =
        fuseops::cross_entropy_forward(logits, target, weight, o.reduction, o.ignore_index,
                                       o.label_smoothing, o.z_loss, o.softcap);
    ctx->mark_non_differentiable({lse, total_weight});
    ctx->set_materialize_grads(false);
    const at::Tensor w = detail::undefined_if_none(weight);
    ctx->save_for_backward({logits, target, w, lse, total_weight});
    ctx->saved_data["has_weight"] = w.defined();
    save_options(ctx, o);
    return {loss, lse, total_weight};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list none(4);
    if (!grads[0].defined()) {
      return none;
    }
    const auto saved = ctx->get_saved_variables();
    const Options o = saved_options(ctx);
    const std::optional<at::Tensor> weight =
        ctx->saved_data["has_weight"].toBool() ? std::optional<at::Tensor>(saved[2]) : std::nullopt;
    variable_list result = none;
    result[0] = fuseops::cross_entropy_backward(grads[0], saved[0], saved[1], weight, saved[3],
                                                saved[4], o.reduction, o.ignore_index,
                                                o.label_smoothing, o.z_loss, o.softcap);
    return result;
  }
};

// The gradient is in `logits` after the forward; backward scales it by
// grad_output in place and returns it.
class CrossEntropyInplaceFunction : public torch::autograd::Function<CrossEntropyInplaceFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, at::Tensor logits, const at::Tensor& target,
                            const std::optional<at::Tensor>& weight, const Options& o) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    at::Tensor loss =
        fuseops::cross_entropy_inplace(logits, target, weight, o.reduction, o.ignore_index,
                                       o.label_smoothing, o.z_loss, o.softcap);
    ctx->saved_data["grad"] = logits.detach();
    ctx->saved_data["used"] = false;
    ctx->saved_data["per_row"] = o.reduction == "none";
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!ctx->saved_data["used"].toBool(),
                "fuseops::cross_entropy_inplace: the backward can run only once (the "
                "gradient lives in the logits buffer and is scaled there in place)");
    autograd_detail::check_not_recording("fuseops::cross_entropy_inplace");
    ctx->saved_data["used"] = true;
    RECORD_FUNCTION("fuseops::cross_entropy_inplace_backward",
                    std::vector<c10::IValue>({grads[0]}));
    at::Tensor grad = ctx->saved_data["grad"].toTensor();
    const at::Tensor& g = grads[0];
    grad.mul_(ctx->saved_data["per_row"].toBool() ? g.unsqueeze(-1) : g);
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Returns (loss, lse, predicted, softmax_stats); only the loss is
// differentiable. For reduction "mean" or "sum" the forward computes the
// gradients (for a grad_output of 1) and the backward scales them in place,
// once. For "none" with a frozen head (weight and bias without gradients,
// as LoRA leaves an LM head) the forward computes the input's gradient of
// each row's loss, and the backward scales each row by its grad_output, any
// number of times. For "none" with a trained head the forward keeps its
// inputs and the backward recomputes the logits
// (linear_cross_entropy_backward, which has no derivative of its own): the
// weight's gradient sums the rows' gradients each scaled by its own
// grad_output, which the forward does not know yet.
class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                               const at::Tensor& target,
                               const std::optional<at::Tensor>& class_weight, const Options& o,
                               std::optional<double> normalizer, bool predict, bool softmax_stats) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->set_materialize_grads(false);
    const bool has_bias = bias.has_value() && bias->defined();
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["used"] = false;
    const bool head_grad = weight.requires_grad() || (has_bias && bias->requires_grad());
    const bool per_row = o.reduction == "none";
    const bool recompute = per_row && head_grad;
    ctx->saved_data["recompute"] = recompute;
    ctx->saved_data["per_row"] = per_row;
    at::Tensor loss;
    at::Tensor lse;
    at::Tensor predicted;
    at::Tensor stats;
    if (recompute) {
      std::tie(loss, lse, predicted, stats) = fuseops::linear_cross_entropy_stats(
          input, weight, bias, target, class_weight, o.reduction, o.ignore_index, o.label_smoothing,
          o.z_loss, o.softcap, normalizer, predict, softmax_stats);
      const at::Tensor cw = detail::undefined_if_none(class_weight);
      ctx->save_for_backward({input, weight, has_bias ? *bias : at::Tensor(), target, cw});
      ctx->saved_data["has_class_weight"] = cw.defined();
      ctx->saved_data["normalizer"] =
          normalizer.has_value() ? c10::IValue(*normalizer) : c10::IValue();
      save_options(ctx, o);
    } else {
      at::Tensor grad_input;
      at::Tensor grad_weight;
      at::Tensor grad_bias;
      std::tie(loss, grad_input, grad_weight, grad_bias, lse, predicted, stats) =
          fuseops::linear_cross_entropy_forward(input, weight, bias, target, class_weight,
                                                o.reduction, o.ignore_index, o.label_smoothing,
                                                o.z_loss, o.softcap, normalizer, predict, head_grad,
                                                softmax_stats);
      ctx->saved_data["grad_input"] = grad_input;
      ctx->saved_data["grad_weight"] = head_grad ? grad_weight : at::Tensor();
      ctx->saved_data["grad_bias"] = head_grad ? grad_bias : at::Tensor();
    }
    ctx->mark_non_differentiable({lse, predicted, stats});
    return {loss, lse, predicted, stats};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(9);
    if (!grads[0].defined()) {
      return result;
    }
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    if (ctx->saved_data["recompute"].toBool()) {
      const auto saved = ctx->get_saved_variables();
      const Options o = saved_options(ctx);
      const c10::IValue& normalizer = ctx->saved_data["normalizer"];
      auto [grad_input, grad_weight, grad_bias] = fuseops::linear_cross_entropy_backward(
          grads[0], saved[0], saved[1],
          has_bias ? std::optional<at::Tensor>(saved[2]) : std::nullopt, saved[3],
          ctx->saved_data["has_class_weight"].toBool() ? std::optional<at::Tensor>(saved[4])
                                                       : std::nullopt,
          o.reduction, o.ignore_index, o.label_smoothing, o.z_loss, o.softcap,
          normalizer.isNone() ? std::nullopt : std::optional<double>(normalizer.toDouble()));
      result[0] = grad_input;
      result[1] = grad_weight;
      if (has_bias) {
        result[2] = grad_bias;
      }
      return result;
    }
    // Named like the backward ops of the other fuseops ops in profiles, with
    // grad_output's shape recorded as theirs is.
    RECORD_FUNCTION("fuseops::linear_cross_entropy_backward", std::vector<c10::IValue>({grads[0]}));
    if (ctx->saved_data["per_row"].toBool()) {
      // A frozen head: each row's input gradient times its grad_output, out
      // of place (the saved gradients stay for another backward).
      autograd_detail::check_not_recording("fuseops::linear_cross_entropy");
      result[0] = ctx->saved_data["grad_input"].toTensor().mul(grads[0].unsqueeze(-1));
      return result;
    }
    TORCH_CHECK(!ctx->saved_data["used"].toBool(),
                "fuseops::linear_cross_entropy: the backward can run only once (its gradients "
                "are computed in the forward and scaled by grad_output in place)");
    autograd_detail::check_not_recording("fuseops::linear_cross_entropy");
    ctx->saved_data["used"] = true;
    const at::Tensor& g = grads[0];
    result[0] = ctx->saved_data["grad_input"].toTensor().mul_(g);
    // Undefined for a frozen head.
    const at::Tensor grad_weight = ctx->saved_data["grad_weight"].toTensor();
    if (grad_weight.defined()) {
      result[1] = grad_weight.mul_(g);
      if (has_bias) {
        result[2] = ctx->saved_data["grad_bias"].toTensor().mul_(g);
      }
    }
    // Drop the references: the gradients now belong to the caller.
    ctx->saved_data.clear();
    ctx->saved_data["used"] = true;
    ctx->saved_data["recompute"] = false;
    ctx->saved_data["per_row"] = false;
    ctx->saved_data["has_bias"] = has_bias;
    return result;
  }
};

Options options(std::string_view reduction, int64_t ignore_index, double label_smoothing,
                double z_loss, std::optional<double> softcap) {
  return {std::string(reduction), ignore_index, label_smoothing, z_loss, softcap};
}

struct CrossEntropyAutograd {
  static at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                                  const std::optional<at::Tensor>& weight,
                                  std::string_view reduction, int64_t ignore_index,
                                  double label_smoothing, double z_loss,
                                  std::optional<double> softcap) {
    check_weight_no_grad("fuseops::cross_entropy", "weight", weight);
    if (!autograd_detail::records_grad({logits})) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      return fuseops::cross_entropy(logits, target, weight, reduction, ignore_index,
                                    label_smoothing, z_loss, softcap);
    }
    return CrossEntropyFunction::apply(
        logits, target, weight,
        options(reduction, ignore_index, label_smoothing, z_loss, softcap))[0];
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy_forward(
      const at::Tensor& logits, const at::Tensor& target, const std::optional<at::Tensor>& weight,
      std::string_view reduction, int64_t ignore_index, double label_smoothing, double z_loss,
      std::optional<double> softcap) {
    check_weight_no_grad("fuseops::cross_entropy_forward", "weight", weight);
    const variable_list r = CrossEntropyFunction::apply(
        logits, target, weight, options(reduction, ignore_index, label_smoothing, z_loss, softcap));
    return {r[0], r[1], r[2]};
  }

  static at::Tensor cross_entropy_inplace(at::Tensor& logits, const at::Tensor& target,
                                          const std::optional<at::Tensor>& weight,
                                          std::string_view reduction, int64_t ignore_index,
                                          double label_smoothing, double z_loss,
                                          std::optional<double> softcap) {
    check_weight_no_grad("fuseops::cross_entropy_inplace", "weight", weight);
    if (!autograd_detail::records_grad({logits})) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      return fuseops::cross_entropy_inplace(logits, target, weight, reduction, ignore_index,
                                            label_smoothing, z_loss, softcap);
    }
    return CrossEntropyInplaceFunction::apply(
        logits, target, weight, options(reduction, ignore_index, label_smoothing, z_loss, softcap));
  }

  static at::Tensor linear_cross_entropy(
      const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
      const at::Tensor& target, const std::optional<at::Tensor>& class_weight,
      std::string_view reduction, int64_t ignore_index, double label_smoothing, double z_loss,
      std::optional<double> softcap, std::optional<double> normalizer) {
    check_weight_no_grad("fuseops::linear_cross_entropy", "class_weight", class_weight);
    if (!autograd_detail::records_grad({input, weight, bias})) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      return fuseops::linear_cross_entropy(input, weight, bias, target, class_weight, reduction,
                                           ignore_index, label_smoothing, z_loss, softcap,
                                           normalizer);
    }
    return LinearCrossEntropyFunction::apply(
        input, weight, bias, target, class_weight,
        options(reduction, ignore_index, label_smoothing, z_loss, softcap), normalizer,
        /*predict=*/false, /*softmax_stats=*/false)[0];
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_stats(
      const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
      const at::Tensor& target, const std::optional<at::Tensor>& class_weight,
      std::string_view reduction, int64_t ignore_index, double label_smoothing, double z_loss,
      std::optional<double> softcap, std::optional<double> normalizer, bool predict,
      bool softmax_stats) {
    check_weight_no_grad("fuseops::linear_cross_entropy_stats", "class_weight", class_weight);
    if (!autograd_detail::records_grad({input, weight, bias})) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      return fuseops::linear_cross_entropy_stats(input, weight, bias, target, class_weight,
                                                 reduction, ignore_index, label_smoothing, z_loss,
                                                 softcap, normalizer, predict, softmax_stats);
    }
    const variable_list r = LinearCrossEntropyFunction::apply(
        input, weight, bias, target, class_weight,
        options(reduction, ignore_index, label_smoothing, z_loss, softcap), normalizer, predict,
        softmax_stats);
    return {r[0], r[1], r[2], r[3]};
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  detail::register_cross_entropy_autograd<CrossEntropyAutograd>(m);
}

}  // namespace fuseops
