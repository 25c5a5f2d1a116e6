// Autograd for fuseops::jsd, registered in C++ so LibTorch programs get
// gradients without Python.
//
// The forward keeps per row the two logsumexps and the student's divergence
// sum (jsd_forward's row_stats); the backward computes the student's gradient
// from them in one pass (jsd_backward), which has no derivative of its own
// (autograd/no_derivative.h). The teacher is a constant of distillation: a
// teacher_logits that requires grad is refused rather than given no
// gradient silently.
//
// fused_linear_jsd with reduction "batchmean", "sum" or "mean" computes its
// gradients in the forward (fused_linear_jsd_forward); its backward only
// scales them by grad_output, in place, so it may run once. With "none" it
// keeps its inputs and the backward recomputes the logits
// (fused_linear_jsd_backward, which has no derivative of its own). The
// teacher's layer is refused likewise when it requires grad.

#include <string>
#include <tuple>
#include <vector>

#include <ATen/record_function.h>

#include <torch/library.h>

#include <fuseops/jsd.h>

#include "ops/autograd/function.h"
#include "ops/autograd/no_derivative.h"
#include "ops/common/tensors.h"
#include "ops_generated/autograd/jsd.h"

namespace fuseops {
namespace {

void check_teacher_no_grad(const char* op, const at::Tensor& teacher,
                           const char* arg = "teacher_logits") {
  TORCH_CHECK(!autograd_detail::records_grad({teacher}), op, ": argument '", arg,
              "' requires grad, but the op is not differentiable with respect to it (the teacher "
              "is a constant of the distillation loss: pass ",
              arg, ".detach())");
}

// The Autograd kernels cpp/ops/jsd.yaml declares as functions.
struct Options {
  double beta;
  double temperature;
  int64_t ignore_index;
  std::string reduction;
};

class JsdFunction : public torch::autograd::Function<JsdFunction> {
 public:
  // Returns (loss, row_stats); only the loss is differentiable.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& student_logits,
                               const at::Tensor& teacher_logits,
                               const std::optional<at::Tensor>& label, const Options& o) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [loss, row_stats] = fuseops::jsd_forward(student_logits, teacher_logits, label, o.beta,
                                                  o.temperature, o.ignore_index, o.reduction);
    ctx->mark_non_differentiable({row_stats});
    ctx->set_materialize_grads(false);
    const at::Tensor l = detail::undefined_if_none(label);
    ctx->save_for_backward({student_logits, teacher_logits, l, row_stats});
    ctx->saved_data["has_label"] = l.defined();
    ctx->saved_data["beta"] = o.beta;
    ctx->saved_data["temperature"] = o.temperature;
    ctx->saved_data["ignore_index"] = o.ignore_index;
    ctx->saved_data["reduction"] = o.reduction;
    return {loss, row_stats};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(4);
    if (!grads[0].defined()) {
      return result;
    }
    const auto saved = ctx->get_saved_variables();
    const std::optional<at::Tensor> label =
        ctx->saved_data["has_label"].toBool() ? std::optional<at::Tensor>(saved[2]) : std::nullopt;
    result[0] = fuseops::jsd_backward(
        grads[0], saved[0], saved[1], label, saved[3], ctx->saved_data["beta"].toDouble(),
        ctx->saved_data["temperature"].toDouble(), ctx->saved_data["ignore_index"].toInt(),
        ctx->saved_data["reduction"].toStringRef());
    return result;
  }
};

// Returns the loss. For reduction "none" the forward keeps its inputs and the
// backward recomputes the logits; otherwise the forward computes the
// gradients (for a grad_output of 1) and the backward scales them in place,
// once.
class FusedLinearJsdFunction : public torch::autograd::Function<FusedLinearJsdFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& student_input,
                            const at::Tensor& student_weight, const at::Tensor& teacher_input,
                            const at::Tensor& teacher_weight,
                            const std::optional<at::Tensor>& label, const Options& o) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->set_materialize_grads(false);
    const bool recompute = o.reduction == "none";
    ctx->saved_data["recompute"] = recompute;
    ctx->saved_data["used"] = false;
    if (recompute) {
      const at::Tensor l = detail::undefined_if_none(label);
      ctx->save_for_backward({student_input, student_weight, teacher_input, teacher_weight, l});
      ctx->saved_data["has_label"] = l.defined();
      ctx->saved_data["beta"] = o.beta;
      ctx->saved_data["temperature"] = o.temperature;
      ctx->saved_data["ignore_index"] = o.ignore_index;
      ctx->saved_data["reduction"] = o.reduction;
      return fuseops::fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight,
                                       label, o.beta, o.temperature, o.ignore_index, o.reduction);
    }
    auto [loss, grad_input, grad_weight] = fuseops::fused_linear_jsd_forward(
        student_input, student_weight, teacher_input, teacher_weight, label, o.beta, o.temperature,
        o.ignore_index, o.reduction);
    ctx->saved_data["grad_input"] = grad_input;
    ctx->saved_data["grad_weight"] = grad_weight;
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(6);
    if (!grads[0].defined()) {
      return result;
    }
    if (ctx->saved_data["recompute"].toBool()) {
      const auto saved = ctx->get_saved_variables();
      const std::optional<at::Tensor> label = ctx->saved_data["has_label"].toBool()
                                                  ? std::optional<at::Tensor>(saved[4])
                                                  : std::nullopt;
      std::tie(result[0], result[1]) = fuseops::fused_linear_jsd_backward(
          grads[0], saved[0], saved[1], saved[2], saved[3], label,
          ctx->saved_data["beta"].toDouble(), ctx->saved_data["temperature"].toDouble(),
          ctx->saved_data["ignore_index"].toInt(), ctx->saved_data["reduction"].toStringRef());
      return result;
    }
    TORCH_CHECK(!ctx->saved_data["used"].toBool(),
                "fuseops::fused_linear_jsd: the backward can run only once (its gradients are "
                "computed in the forward and scaled by grad_output in place)");
    autograd_detail::check_not_recording("fuseops::fused_linear_jsd");
    // Named like the backward ops of the other fuseops ops in profiles, with
    // grad_output's shape recorded as theirs is.
    RECORD_FUNCTION("fuseops::fused_linear_jsd_backward", std::vector<c10::IValue>({grads[0]}));
    result[0] = ctx->saved_data["grad_input"].toTensor().mul_(grads[0]);
    result[1] = ctx->saved_data["grad_weight"].toTensor().mul_(grads[0]);
    // Drop the references: the gradients now belong to the caller.
    ctx->saved_data.clear();
    ctx->saved_data["used"] = true;
    ctx->saved_data["recompute"] = false;
    return result;
  }
};

void check_teacher_layer_no_grad(const char* op, const at::Tensor& teacher_input,
                                 const at::Tensor& teacher_weight) {
  check_teacher_no_grad(op, teacher_input, "teacher_input");
  check_teacher_no_grad(op, teacher_weight, "teacher_weight");
}

struct JsdAutograd {
  static at::Tensor jsd(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
                        const std::optional<at::Tensor>& label, double beta, double temperature,
                        int64_t ignore_index, std::string_view reduction) {
    check_teacher_no_grad("fuseops::jsd", teacher_logits);
    if (!autograd_detail::records_grad({student_logits})) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      return fuseops::jsd(student_logits, teacher_logits, label, beta, temperature, ignore_index,
                          reduction);
    }
    return JsdFunction::apply(student_logits, teacher_logits, label,
                              Options{beta, temperature, ignore_index, std::string(reduction)})[0];
  }

  static std::tuple<at::Tensor, at::Tensor> jsd_forward(const at::Tensor& student_logits,
                                                        const at::Tensor& teacher_logits,
                                                        const std::optional<at::Tensor>& label,
                                                        double beta, double temperature,
                                                        int64_t ignore_index,
                                                        std::string_view reduction) {
    check_teacher_no_grad("fuseops::jsd_forward", teacher_logits);
    const variable_list r =
        JsdFunction::apply(student_logits, teacher_logits, label,
                           Options{beta, temperature, ignore_index, std::string(reduction)});
    return {r[0], r[1]};
  }

  static at::Tensor fused_linear_jsd(const at::Tensor& student_input,
                                     const at::Tensor& student_weight,
                                     const at::Tensor& teacher_input,
                                     const at::Tensor& teacher_weight,
                                     const std::optional<at::Tensor>& label, double beta,
                                     double temperature, int64_t ignore_index,
                                     std::string_view reduction) {
    check_teacher_layer_no_grad("fuseops::fused_linear_jsd", teacher_input, teacher_weight);
    if (!autograd_detail::records_grad({student_input, student_weight})) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      return fuseops::fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight,
                                       label, beta, temperature, ignore_index, reduction);
    }
    return FusedLinearJsdFunction::apply(
        student_input, student_weight, teacher_input, teacher_weight, label,
        Options{beta, temperature, ignore_index, std::string(reduction)});
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) { detail::register_jsd_autograd<JsdAutograd>(m); }

}  // namespace fuseops
