// Autograd for fuseops::gelu, silu and bias_gelu, registered in C++ so
// LibTorch programs get gradients without Python. gelu_backward and
// silu_backward are differentiable too (double backward, gradgradcheck);
// bias_gelu_backward is not (see autograd/no_derivative.h).
// Function::apply fails on an undefined tensor with a message naming
// nothing, so each kernel checks its tensors first.

#include <string>
#include <tuple>

#include <ATen/TensorOperators.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/tanh.h>
#include <torch/library.h>

#include <fuseops/activation.h>

#include "ops/activation.h"
#include "ops/autograd/function.h"
#include "ops/autograd/no_derivative.h"
#include "ops/autograd/reusable_gradient.h"
#include "ops/common/checks.h"
#include "ops/common/tensors.h"
#include "ops_generated/autograd/activation.h"

namespace fuseops {
namespace {

using detail::Activation;

// Second derivative f''(x), composed of ATen ops: only double backward
// needs it, where clarity beats speed.
at::Tensor activation_second_derivative(const at::Tensor& x, Activation activation) {
  using C = detail::GeluConstants<double>;
  switch (activation) {
    case Activation::Silu: {
      const at::Tensor s = at::sigmoid(x);
      return s * (1 - s) * (2 + x * (1 - 2 * s));
    }
    case Activation::GeluErf: {
      // d/dx [Phi(x) + x phi(x)] = phi(x) (2 - x^2).
      return C::kBeta * at::exp(-0.5 * x * x) * (2 - x * x);
    }
    case Activation::GeluTanh: {
      // f = x/2 (1 + tanh(u)), u = k (x + c x^3):
      // f'' = (1 - t^2) (u' + x/2 (u'' - 2 t u'^2)).
      const double k = C::kTanhBeta;
      const double c = C::kKappa;
      const at::Tensor t = at::tanh(k * (x + c * x * x * x));
      const at::Tensor du = k * (1 + 3 * c * x * x);
      const at::Tensor d2u = 6 * k * c * x;
      return (1 - t * t) * (du + 0.5 * x * (d2u - 2 * t * du * du));
    }
  }
  TORCH_CHECK(false, "fuseops: unknown activation");
}

// grad_input = grad_output * f'(input), differentiable in both.
class ActivationBackwardFunction : public torch::autograd::Function<ActivationBackwardFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad_output,
                            const at::Tensor& input, const std::string& approximate, bool is_silu) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({grad_output, input});
    autograd_detail::save_approximate(ctx, approximate);
    ctx->saved_data["is_silu"] = is_silu;
    return is_silu ? fuseops::silu_backward(grad_output, input)
                   : fuseops::gelu_backward(grad_output, input, approximate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& grad_output = saved[0];
    const at::Tensor& input = saved[1];
    const std::string approximate = autograd_detail::saved_approximate(ctx);
    const bool is_silu = ctx->saved_data["is_silu"].toBool();
    const at::Tensor& upstream = grads[0];
    const Activation activation =
        is_silu ? Activation::Silu
                : detail::parse_gelu_approximate("fuseops::gelu_backward", approximate);
    at::Tensor d_grad_output;
    at::Tensor d_input;
    if (ctx->needs_input_grad(0)) {
      d_grad_output = is_silu ? fuseops::silu_backward(upstream, input)
                              : fuseops::gelu_backward(upstream, input, approximate);
    }
    if (ctx->needs_input_grad(1)) {
      d_input = upstream * grad_output * activation_second_derivative(input, activation);
    }
    return {d_grad_output, d_input, at::Tensor(), at::Tensor()};
  }
};

class GeluFunction : public torch::autograd::Function<GeluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            const std::string& approximate) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({input});
    autograd_detail::save_approximate(ctx, approximate);
    return fuseops::gelu(input, approximate);
  }

  // `grads` by reference: the gradient is moved out, so that a sole owner
  // can be overwritten (autograd/reusable_gradient.h).
  static variable_list backward(AutogradContext* ctx, variable_list& grads) {
    const at::Tensor input = ctx->get_saved_variables()[0];
    const std::string approximate = autograd_detail::saved_approximate(ctx);
    return {
        autograd_detail::gradient_over(
            grads[0], input,
            [&](at::Tensor& grad) { fuseops::gelu_backward_out(grad, input, approximate, grad); },
            [&](const at::Tensor& grad) {
              return ActivationBackwardFunction::apply(grad, input, approximate, false);
            }),
        at::Tensor()};
  }
};

class SiluFunction : public torch::autograd::Function<SiluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({input});
    return fuseops::silu(input);
  }

  static variable_list backward(AutogradContext* ctx, variable_list& grads) {
    const at::Tensor input = ctx->get_saved_variables()[0];
    return {autograd_detail::gradient_over(
        grads[0], input, [&](at::Tensor& grad) { fuseops::silu_backward_out(grad, input, grad); },
        [&](const at::Tensor& grad) {
          return ActivationBackwardFunction::apply(grad, input, std::string("none"), true);
        })};
  }
};

class BiasGeluFunction : public torch::autograd::Function<BiasGeluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& bias,
                            const std::string& approximate) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({input, bias});
    autograd_detail::save_approximate(ctx, approximate);
    return fuseops::bias_gelu(input, bias, approximate);
  }

  // `grads` by reference: the gradient is moved out, so that a sole owner
  // can be overwritten with the input's gradient (autograd/reusable_gradient.h).
  static variable_list backward(AutogradContext* ctx, variable_list& grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& bias = saved[1];
    const std::string approximate = autograd_detail::saved_approximate(ctx);
    at::Tensor grad_bias;
    const at::Tensor grad_input = autograd_detail::gradient_over(
        grads[0], input,
        [&](at::Tensor& grad) {
          grad_bias = detail::empty_contiguous_like(bias);
          fuseops::bias_gelu_backward_out(grad, input, bias, approximate, grad, grad_bias);
        },
        [&](const at::Tensor& grad) {
          at::Tensor grad_input;
          std::tie(grad_input, grad_bias) =
              fuseops::bias_gelu_backward(grad, input, bias, approximate);
          return grad_input;
        });
    return {grad_input, grad_bias, at::Tensor()};
  }
};

// The Autograd kernels cpp/ops/activation.yaml declares as functions.
struct ActivationAutograd {
  static at::Tensor gelu(const at::Tensor& input, c10::string_view approximate) {
    check_floating_input("fuseops::gelu", "input", input);
    return GeluFunction::apply(input, std::string(approximate));
  }

  static at::Tensor gelu_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                  c10::string_view approximate) {
    check_floating_input("fuseops::gelu_backward", "grad_output", grad_output);
    check_floating_input("fuseops::gelu_backward", "input", input);
    return ActivationBackwardFunction::apply(grad_output, input, std::string(approximate), false);
  }

  static at::Tensor silu(const at::Tensor& input) {
    check_floating_input("fuseops::silu", "input", input);
    return SiluFunction::apply(input);
  }

  static at::Tensor silu_backward(const at::Tensor& grad_output, const at::Tensor& input) {
    check_floating_input("fuseops::silu_backward", "grad_output", grad_output);
    check_floating_input("fuseops::silu_backward", "input", input);
    return ActivationBackwardFunction::apply(grad_output, input, std::string("none"), true);
  }

  static at::Tensor bias_gelu(const at::Tensor& input, const at::Tensor& bias,
                              c10::string_view approximate) {
    check_floating_input("fuseops::bias_gelu", "input", input);
    check_floating_input("fuseops::bias_gelu", "bias", bias);
    return BiasGeluFunction::apply(input, bias, std::string(approximate));
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  detail::register_activation_autograd<ActivationAutograd>(m);
}

}  // namespace fuseops
