// Autograd for fuseops::rms_norm and fuseops::fused_add_rms_norm, registered
// in C++ so LibTorch programs get gradients without Python. The forward saves
// the per-row rstd; the backward is one fused op (input and weight gradients
// in one pass). Double backward (create_graph=True) differentiates an ATen
// composite of the same gradient formula instead; the backward ops
// themselves have no derivative (see autograd/no_derivative.h).
// Function::apply fails on an undefined tensor with a message naming
// nothing, so each kernel checks its tensors first.

#include <initializer_list>
#include <optional>
#include <tuple>

#include <ATen/OpMathType.h>
#include <ATen/TensorOperators.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include <fuseops/rms_norm.h>

#include "ops/autograd/function.h"
#include "ops/autograd/no_derivative.h"
#include "ops/autograd/reusable_gradient.h"
#include "ops/common/checks.h"
#include "ops/common/tensors.h"
#include "ops/rms_norm.h"
#include "ops_generated/autograd/rms_norm.h"

namespace fuseops {
namespace {

using autograd_detail::records_grad;
using detail::none_if_undefined;
using detail::undefined_if_none;

// Gradients of out = x * rstd(x) * weight in differentiable ATen ops, for
// create_graph=True; in the computation dtype, cast back like the fused op.
std::tuple<at::Tensor, at::Tensor> composite_backward(const at::Tensor& grad,
                                                      const at::Tensor& input,
                                                      const at::Tensor& weight, double eps) {
  const at::ScalarType opmath = at::toOpMathType(input.scalar_type());
  const at::Tensor x = input.to(opmath);
  const at::Tensor g = grad.to(opmath);
  const at::Tensor rstd = (x.pow(2).mean(-1, /*keepdim=*/true) + eps).rsqrt();
  const at::Tensor x_hat = x * rstd;
  const at::Tensor g_hat = weight.defined() ? g * weight.to(opmath) : g;
  const at::Tensor grad_input = rstd * (g_hat - x_hat * (g_hat * x_hat).mean(-1, /*keepdim=*/true));
  at::Tensor grad_weight;
  if (weight.defined()) {
    // Rows counted explicitly: reshape cannot infer them (-1) when the
    // hidden size is 0.
    const int64_t rows = c10::multiply_integers(x.sizes().slice(0, x.dim() - 1));
    grad_weight = (g * x_hat).reshape({rows, x.size(-1)}).sum(0).to(weight.scalar_type());
  }
  return {grad_input.to(input.scalar_type()), grad_weight};
}

// grad_weight= of the backward out= overloads: the weight's gradient, or
// empty without a weight.
at::Tensor empty_grad_weight(const at::Tensor& input, const at::Tensor& weight) {
  return detail::empty_output({weight.defined() ? input.size(-1) : 0},
                              weight.defined() ? weight.options() : input.options());
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  // Returns (out, rstd); rstd is not differentiable.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const std::optional<at::Tensor>& weight, std::optional<double> eps) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, rstd] = fuseops::rms_norm_forward(input, weight, eps);
    ctx->mark_non_differentiable({rstd});
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({input, undefined_if_none(weight), rstd});
    ctx->saved_data["eps"] = detail::resolve_eps(eps, input);
    return {out, rstd};
  }

  // `grads` by reference: the gradient is moved out, so that a sole owner
  // can be overwritten with the input's gradient (autograd/reusable_gradient.h).
  static variable_list backward(AutogradContext* ctx, variable_list& grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& rstd = saved[2];
    if (!grads[0].defined()) {
      return {at::Tensor(), at::Tensor(), at::Tensor()};
    }
    // Not reused under grad mode (reusable_gradient), where the composite runs.
    at::Tensor grad_weight;
    const at::Tensor grad_input = autograd_detail::gradient_over(
        grads[0], input,
        [&](at::Tensor& grad) {
          grad_weight = empty_grad_weight(input, weight);
          fuseops::rms_norm_backward_out(grad, input, none_if_undefined(weight), rstd, grad,
                                         grad_weight);
        },
        [&](const at::Tensor& grad) {
          at::Tensor grad_input;
          std::tie(grad_input, grad_weight) =
              at::GradMode::is_enabled()
                  ? composite_backward(grad, input, weight, ctx->saved_data["eps"].toDouble())
                  : fuseops::rms_norm_backward(grad, input, none_if_undefined(weight), rstd);
          return grad_input;
        });
    return {grad_input, weight.defined() ? grad_weight : at::Tensor(), at::Tensor()};
  }
};

class FusedAddRmsNormFunction : public torch::autograd::Function<FusedAddRmsNormFunction> {
 public:
  // Returns (out, new_residual, rstd); rstd is not differentiable.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& residual, const std::optional<at::Tensor>& weight,
                               std::optional<double> eps) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, new_residual, rstd] =
        fuseops::fused_add_rms_norm_forward(input, residual, weight, eps);
    ctx->mark_non_differentiable({rstd});
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({new_residual, undefined_if_none(weight), rstd});
    ctx->saved_data["eps"] = detail::resolve_eps(eps, input);
    return {out, new_residual, rstd};
  }

  // `grads` by reference: the output's gradient is moved out, so that a sole
  // owner can be overwritten with the gradient of the sum
  // (autograd/reusable_gradient.h). That of new_residual is not: it is
  // usually also the gradient of the next layer's input (this op hands one
  // tensor to both its inputs), still referred to there.
  static variable_list backward(AutogradContext* ctx, variable_list& grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& new_residual = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& rstd = saved[2];
    const at::Tensor& grad_new_residual = grads[1];
    // new_residual = input + residual: both receive the gradient of
    // new_residual, which sums its two uses (the norm and the output).
    at::Tensor grad_sum, grad_weight;
    if (!grads[0].defined()) {
      grad_sum = grad_new_residual;
    } else {
      // Not reused under grad mode (reusable_gradient), where the composite runs.
      grad_sum = autograd_detail::gradient_over(
          grads[0], new_residual,
          [&](at::Tensor& grad) {
            grad_weight = empty_grad_weight(new_residual, weight);
            fuseops::fused_add_rms_norm_backward_out(grad, none_if_undefined(grad_new_residual),
                                                     new_residual, none_if_undefined(weight), rstd,
                                                     grad, grad_weight);
          },
          [&](const at::Tensor& grad) {
            at::Tensor grad_sum;
            if (at::GradMode::is_enabled()) {
              std::tie(grad_sum, grad_weight) =
                  composite_backward(grad, new_residual, weight, ctx->saved_data["eps"].toDouble());
              return grad_new_residual.defined() ? grad_sum + grad_new_residual : grad_sum;
            }
            std::tie(grad_sum, grad_weight) =
                fuseops::fused_add_rms_norm_backward(grad, none_if_undefined(grad_new_residual),
                                                     new_residual, none_if_undefined(weight), rstd);
            return grad_sum;
          });
    }
    return {grad_sum, grad_sum, weight.defined() ? grad_weight : at::Tensor(), at::Tensor()};
  }
};

// The Autograd kernels cpp/ops/rms_norm.yaml declares as functions.
struct RmsNormAutograd {
  static at::Tensor rms_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                             std::optional<double> eps) {
    check_floating_input("fuseops::rms_norm", "input", input);
    if (!records_grad({input, weight})) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      return fuseops::rms_norm(input, weight, eps);
    }
    return RmsNormFunction::apply(input, weight, eps)[0];
  }

  static std::tuple<at::Tensor, at::Tensor> rms_norm_forward(
      const at::Tensor& input, const std::optional<at::Tensor>& weight, std::optional<double> eps) {
    check_floating_input("fuseops::rms_norm_forward", "input", input);
    const variable_list result = RmsNormFunction::apply(input, weight, eps);
    return {result[0], result[1]};
  }

  static std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(
      const at::Tensor& input, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
      std::optional<double> eps) {
    check_floating_input("fuseops::fused_add_rms_norm", "input", input);
    check_floating_input("fuseops::fused_add_rms_norm", "residual", residual);
    if (!records_grad({input, residual, weight})) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      return fuseops::fused_add_rms_norm(input, residual, weight, eps);
    }
    const variable_list result = FusedAddRmsNormFunction::apply(input, residual, weight, eps);
    return {result[0], result[1]};
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_forward(
      const at::Tensor& input, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
      std::optional<double> eps) {
    check_floating_input("fuseops::fused_add_rms_norm_forward", "input", input);
    check_floating_input("fuseops::fused_add_rms_norm_forward", "residual", residual);
    const variable_list result = FusedAddRmsNormFunction::apply(input, residual, weight, eps);
    return {result[0], result[1], result[2]};
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) { detail::register_rms_norm_autograd<RmsNormAutograd>(m); }

}  // namespace fuseops
