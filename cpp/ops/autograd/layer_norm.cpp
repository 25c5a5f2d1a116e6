// Autograd for fuseops::layer_norm, registered in C++ so LibTorch programs get
// gradients without Python. The forward keeps the per-row mean and rstd, so
// backward reads each input once and never recomputes the statistics.
// layer_norm_backward has no derivative of its own (see
// autograd/no_derivative.h).

#include <tuple>

#include <torch/library.h>

#include <fuseops/layer_norm.h>

#include "ops/autograd/function.h"
#include "ops/autograd/no_derivative.h"
#include "ops/autograd/reusable_gradient.h"
#include "ops/common/tensors.h"
#include "ops_generated/autograd/layer_norm.h"

namespace fuseops {
namespace {

class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  // Returns (out, mean, rstd); mean and rstd are not differentiable.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, mean, rstd] = fuseops::layer_norm_forward(input, weight, bias, eps);
    ctx->mark_non_differentiable({mean, rstd});
    ctx->set_materialize_grads(false);
    const at::Tensor w = detail::undefined_if_none(weight);
    ctx->save_for_backward({input, w, mean, rstd});
    ctx->saved_data["has_weight"] = w.defined();
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    return {out, mean, rstd};
  }

  // `grads` by reference: the gradient is moved out, so that a sole owner
  // can be overwritten with the input's gradient (autograd/reusable_gradient.h).
  static variable_list backward(AutogradContext* ctx, variable_list& grads) {
    if (!grads[0].defined()) {
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const std::optional<at::Tensor> weight =
        ctx->saved_data["has_weight"].toBool() ? std::optional<at::Tensor>(saved[1]) : std::nullopt;
    at::Tensor grad_weight, grad_bias;
    const at::Tensor grad_input = autograd_detail::gradient_over(
        grads[0], input,
        [&](at::Tensor& grad) {
          grad_weight = detail::empty_output({input.size(-1)}, input.options());
          grad_bias = detail::empty_output({input.size(-1)}, input.options());
          fuseops::layer_norm_backward_out(grad, input, weight, saved[2], saved[3], grad,
                                           grad_weight, grad_bias);
        },
        [&](const at::Tensor& grad) {
          at::Tensor grad_input;
          std::tie(grad_input, grad_weight, grad_bias) =
              fuseops::layer_norm_backward(grad, input, weight, saved[2], saved[3]);
          return grad_input;
        });
    return {grad_input, weight.has_value() ? grad_weight : at::Tensor(),
            ctx->saved_data["has_bias"].toBool() ? grad_bias : at::Tensor(), at::Tensor()};
  }
};

// The Autograd kernels cpp/ops/layer_norm.yaml declares as functions.
struct LayerNormAutograd {
  static at::Tensor layer_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps) {
    if (!autograd_detail::records_grad({input, weight, bias})) {
      // No graph to record: skip saving the statistics.
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      return fuseops::layer_norm(input, weight, bias, eps);
    }
    return LayerNormFunction::apply(input, weight, bias, eps)[0];
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_forward(
      const at::Tensor& input, const std::optional<at::Tensor>& weight,
      const std::optional<at::Tensor>& bias, double eps) {
    const variable_list result = LayerNormFunction::apply(input, weight, bias, eps);
    return {result[0], result[1], result[2]};
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  detail::register_layer_norm_autograd<LayerNormAutograd>(m);
}

}  // namespace fuseops
