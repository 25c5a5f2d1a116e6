// Autograd for fuseops::causal_conv1d and causal_conv1d_forward, registered
// in C++ so LibTorch programs get gradients without Python. The forward
// saves its inputs only: the backward recomputes the pre-activation from x
// (width multiply-adds per element) rather than keep a tensor the size of x
// alive until backward. causal_conv1d_backward has no derivative of its own
// (see autograd/no_derivative.h); causal_conv1d_update is for inference and
// refuses to run while a gradient would be recorded.

#include <string>

#include <torch/library.h>

#include <fuseops/causal_conv1d.h>

#include "ops/autograd/function.h"
#include "ops/autograd/no_derivative.h"
#include "ops/common/tensors.h"
#include "ops_generated/autograd/causal_conv1d.h"

namespace fuseops {
namespace {

using Activation = std::optional<std::string_view>;

class CausalConv1dFunction : public torch::autograd::Function<CausalConv1dFunction> {
 public:
  // Returns (out) or, with `with_final_states`, (out, final_states).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias,
                               const std::optional<at::Tensor>& initial_states,
                               Activation activation, bool with_final_states) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    variable_list result;
    if (with_final_states) {
      auto [out, states] =
          fuseops::causal_conv1d_forward(x, weight, bias, initial_states, activation);
      result = {out, states};
    } else {
      result = {fuseops::causal_conv1d(x, weight, bias, initial_states, activation)};
    }
    const at::Tensor b = detail::undefined_if_none(bias);
    const at::Tensor init = detail::undefined_if_none(initial_states);
    ctx->save_for_backward({x, weight, b, init});
    ctx->saved_data["has_bias"] = b.defined();
    ctx->saved_data["has_initial_states"] = init.defined();
    ctx->saved_data["activation"] =
        activation.has_value() ? c10::IValue(std::string(*activation)) : c10::IValue();
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const bool has_init = ctx->saved_data["has_initial_states"].toBool();
    const c10::IValue& name = ctx->saved_data["activation"];
    const std::string activation = name.isNone() ? std::string() : name.toStringRef();
    const std::optional<at::Tensor> bias =
        has_bias ? std::optional<at::Tensor>(saved[2]) : std::nullopt;
    const std::optional<at::Tensor> init =
        has_init ? std::optional<at::Tensor>(saved[3]) : std::nullopt;
    const std::optional<at::Tensor> grad_final =
        grads.size() > 1 ? std::optional<at::Tensor>(grads[1]) : std::nullopt;
    auto [grad_x, grad_weight, grad_bias, grad_init] =
        fuseops::causal_conv1d_backward(grads[0], saved[0], saved[1], bias, init, grad_final,
                                        name.isNone() ? Activation() : Activation(activation));
    return {grad_x,
            grad_weight,
            has_bias ? grad_bias : at::Tensor(),
            has_init ? grad_init : at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

// The Autograd kernels cpp/ops/causal_conv1d.yaml declares as functions.
struct CausalConv1dAutograd {
  static at::Tensor causal_conv1d(const at::Tensor& x, const at::Tensor& weight,
                                  const std::optional<at::Tensor>& bias,
                                  const std::optional<at::Tensor>& initial_states,
                                  Activation activation) {
    if (!autograd_detail::records_grad({x, weight, bias, initial_states})) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      return fuseops::causal_conv1d(x, weight, bias, initial_states, activation);
    }
    return CausalConv1dFunction::apply(x, weight, bias, initial_states, activation, false)[0];
  }

  static std::tuple<at::Tensor, at::Tensor> causal_conv1d_forward(
      const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
      const std::optional<at::Tensor>& initial_states, Activation activation) {
    // Without a gradient to record, the op's own checks name it and the
    // argument (autograd's input handling fails on an undefined x first).
    if (!autograd_detail::records_grad({x, weight, bias, initial_states})) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      return fuseops::causal_conv1d_forward(x, weight, bias, initial_states, activation);
    }
    const variable_list result =
        CausalConv1dFunction::apply(x, weight, bias, initial_states, activation, true);
    return {result[0], result[1]};
  }

  static at::Tensor causal_conv1d_update(const at::Tensor& x, at::Tensor& conv_state,
                                         const at::Tensor& weight,
                                         const std::optional<at::Tensor>& bias,
                                         Activation activation) {
    TORCH_CHECK(!autograd_detail::records_grad({x, conv_state, weight, bias}),
                "fuseops::causal_conv1d_update is not differentiable (an inference step that "
                "shifts conv_state in place): call it under torch.no_grad() or "
                "torch.inference_mode(), or on tensors that do not require grad");
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      out = fuseops::causal_conv1d_update(x, conv_state, weight, bias, activation);
    }
    // conv_state changed in place: views and saved tensors must see a new version.
    conv_state.unsafeGetTensorImpl()->bump_version();
    return out;
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  detail::register_causal_conv1d_autograd<CausalConv1dAutograd>(m);
}

}  // namespace fuseops
