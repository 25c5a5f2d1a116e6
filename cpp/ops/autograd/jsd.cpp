// Autograd for fuseops::jsd, registered in C++ so LibTorch programs get
// gradients without Python.
//
// The forward keeps per row the two logsumexps and the student's divergence
// sum (jsd_forward's row_stats); the backward computes the student's gradient
// from them in one pass (jsd_backward), which has no derivative of its own
// (autograd/no_derivative.h). The teacher is a constant of distillation: a
// teacher_logits that requires grad is refused rather than given no
// gradient silently.

#include <string>
#include <tuple>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <fuseops/jsd.h>

#include "ops/autograd/no_derivative.h"
#include "ops/common/tensors.h"

namespace fuseops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void check_teacher_no_grad(const char* op, const at::Tensor& teacher_logits) {
  TORCH_CHECK(!autograd_detail::records_grad({teacher_logits}), op,
              ": argument 'teacher_logits' requires grad, but the op is not differentiable with "
              "respect to it (the teacher is a constant of the distillation loss: pass "
              "teacher_logits.detach())");
}

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

at::Tensor jsd_autograd(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
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

std::tuple<at::Tensor, at::Tensor> jsd_forward_autograd(const at::Tensor& student_logits,
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

at::Tensor jsd_backward_autograd(const at::Tensor& grad_output, const at::Tensor& student_logits,
                                 const at::Tensor& teacher_logits,
                                 const std::optional<at::Tensor>& label,
                                 const at::Tensor& row_stats, double beta, double temperature,
                                 int64_t ignore_index, std::string_view reduction) {
  autograd_detail::check_no_derivative("fuseops::jsd_backward",
                                       {grad_output, student_logits, teacher_logits, row_stats});
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fuseops::jsd_backward(grad_output, student_logits, teacher_logits, label, row_stats, beta,
                               temperature, ignore_index, reduction);
}

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  m.impl("jsd", TORCH_FN(jsd_autograd));
  m.impl("jsd_forward", TORCH_FN(jsd_forward_autograd));
  m.impl("jsd_backward", TORCH_FN(jsd_backward_autograd));
}

}  // namespace fuseops
