// fuseops::gelu, silu and bias_gelu: the C++ API, the shared checks and the
// `*_with` entry points that every backend's kernels go through. The schemas
// and the Meta, CPU and CUDA registrations are generated from
// cpp/ops/activation.yaml. CPU kernels: cpp/ops/cpu/activation_kernel.cpp;
// CUDA: cuda/activation_kernel.cu; autograd: cpp/ops/autograd/activation.cpp.

#include "ops/activation.h"

#include <torch/library.h>

#include <fuseops/activation.h>

#include "ops/common/autocast.h"
#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/tensors.h"

namespace fuseops {
namespace detail {

Activation parse_gelu_approximate(const char* op, std::string_view approximate) {
  if (approximate == "none") {
    return Activation::GeluErf;
  }
  if (approximate == "tanh") {
    return Activation::GeluTanh;
  }
  TORCH_CHECK(false, op, ": argument 'approximate' must be 'none' or 'tanh', got '", approximate,
              "'");
}

namespace {

void check_bias_gelu_inputs(const char* op, const at::Tensor& input, const at::Tensor& bias) {
  check_floating_input(op, "input", input);
  check_floating_input(op, "bias", bias);
  check_same_dtype(op, "bias", bias, "input", input);
  check_same_device(op, "bias", bias, "input", input);
  TORCH_CHECK(input.dim() >= 1, op,
              ": argument 'input' must have at least one dimension, got a 0-d tensor");
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == input.size(-1), op,
              ": argument 'bias' must be 1-D of size input.size(-1) = ", input.size(-1),
              ", got shape ", bias.sizes());
}

}  // namespace

at::Tensor activation_with(const char* op, const at::Tensor& input, Activation activation,
                           ActivationKernel kernel) {
  check_floating_input(op, "input", input);
  at::Tensor out = empty_contiguous_like(input);
  if (kernel != nullptr && input.numel() > 0) {
    kernel(out, input.contiguous(), activation);
  }
  return out;
}

at::Tensor& activation_out_with(const char* op, const at::Tensor& input, Activation activation,
                                at::Tensor& out, ActivationKernel kernel) {
  check_floating_input(op, "input", input);
  check_out(op, out, "input", input);
  prepare_outputs(op, {{"out", out}}, input.sizes(), {{"input", input}});
  if (kernel == nullptr || input.numel() == 0) {
    return out;
  }
  const at::Tensor contiguous_input = input.contiguous();
  fill_out(out, {contiguous_input}, {},
           [&](const at::Tensor& target) { kernel(target, contiguous_input, activation); });
  return out;
}

namespace {

void check_activation_backward(const char* op, const at::Tensor& grad_output,
                               const at::Tensor& input) {
  check_floating_input(op, "grad_output", grad_output);
  check_floating_input(op, "input", input);
  check_same_dtype(op, "grad_output", grad_output, "input", input);
  check_same_device(op, "grad_output", grad_output, "input", input);
  check_same_shape(op, "grad_output", grad_output, "input", input);
}

}  // namespace

at::Tensor activation_backward_with(const char* op, const at::Tensor& grad_output,
                                    const at::Tensor& input, Activation activation,
                                    ActivationBackwardKernel kernel) {
  check_activation_backward(op, grad_output, input);
  at::Tensor grad_input = empty_contiguous_like(input);
  if (kernel != nullptr && input.numel() > 0) {
    kernel(grad_input, grad_output.contiguous(), input.contiguous(), activation);
  }
  return grad_input;
}

at::Tensor& activation_backward_out_with(const char* op, const at::Tensor& grad_output,
                                         const at::Tensor& input, Activation activation,
                                         at::Tensor& grad_input, ActivationBackwardKernel kernel) {
  check_activation_backward(op, grad_output, input);
  check_out(op, grad_input, "input", input);
  prepare_outputs(op, {{"out", grad_input}}, input.sizes(),
                  {{"grad_output", grad_output}, {"input", input}});
  if (kernel == nullptr || input.numel() == 0) {
    return grad_input;
  }
  const at::Tensor contiguous_grad = grad_output.contiguous();
  const at::Tensor contiguous_input = input.contiguous();
  // Elementwise: grad_input may be exactly grad_output or input.
  fill_out(grad_input, {contiguous_grad, contiguous_input}, {}, [&](const at::Tensor& target) {
    kernel(target, contiguous_grad, contiguous_input, activation);
  });
  return grad_input;
}

at::Tensor bias_gelu_with(const at::Tensor& input, const at::Tensor& bias,
                          std::string_view approximate, BiasGeluKernel kernel) {
  constexpr const char* op = "fuseops::bias_gelu";
  check_bias_gelu_inputs(op, input, bias);
  const Activation activation = parse_gelu_approximate(op, approximate);
  at::Tensor out = empty_contiguous_like(input);
  if (kernel != nullptr && input.numel() > 0) {
    kernel(out, input.contiguous(), bias.contiguous(), activation);
  }
  return out;
}

at::Tensor& bias_gelu_out_with(const at::Tensor& input, const at::Tensor& bias,
                               std::string_view approximate, at::Tensor& out,
                               BiasGeluKernel kernel) {
  constexpr const char* op = "fuseops::bias_gelu.out";
  check_bias_gelu_inputs(op, input, bias);
  const Activation activation = parse_gelu_approximate(op, approximate);
  check_out(op, out, "input", input);
  prepare_outputs(op, {{"out", out}}, input.sizes(), {{"input", input}, {"bias", bias}});
  if (kernel == nullptr || input.numel() == 0) {
    return out;
  }
  const at::Tensor contiguous_input = input.contiguous();
  const at::Tensor contiguous_bias = bias.contiguous();
  fill_out(out, {contiguous_input}, {contiguous_bias}, [&](const at::Tensor& target) {
    kernel(target, contiguous_input, contiguous_bias, activation);
  });
  return out;
}

namespace {

Activation check_bias_gelu_backward(const char* op, const at::Tensor& grad_output,
                                    const at::Tensor& input, const at::Tensor& bias,
                                    std::string_view approximate) {
  check_floating_input(op, "grad_output", grad_output);
  check_bias_gelu_inputs(op, input, bias);
  check_same_dtype(op, "grad_output", grad_output, "input", input);
  check_same_device(op, "grad_output", grad_output, "input", input);
  check_same_shape(op, "grad_output", grad_output, "input", input);
  return parse_gelu_approximate(op, approximate);
}

// Fills both gradients (contiguous, allocated); grad_input may be exactly
// grad_output or input (the kernels read an element before writing it).
void run_bias_gelu_backward(BiasGeluBackwardKernel kernel, const at::Tensor& grad_input,
                            const at::Tensor& grad_bias, const at::Tensor& grad_output,
                            const at::Tensor& input, const at::Tensor& bias,
                            Activation activation) {
  if (input.numel() == 0) {
    // No rows: the bias gradient is an empty sum.
    grad_bias.zero_();
    return;
  }
  kernel(grad_input, grad_bias, grad_output, input, bias.contiguous(), activation);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_with(const at::Tensor& grad_output,
                                                           const at::Tensor& input,
                                                           const at::Tensor& bias,
                                                           std::string_view approximate,
                                                           BiasGeluBackwardKernel kernel) {
  const Activation activation = check_bias_gelu_backward("fuseops::bias_gelu_backward", grad_output,
                                                         input, bias, approximate);
  at::Tensor grad_input = empty_contiguous_like(input);
  at::Tensor grad_bias = empty_contiguous_like(bias);
  if (kernel != nullptr) {
    run_bias_gelu_backward(kernel, grad_input, grad_bias, grad_output.contiguous(),
                           input.contiguous(), bias, activation);
  }
  return {grad_input, grad_bias};
}

void bias_gelu_backward_out_with(const at::Tensor& grad_output, const at::Tensor& input,
                                 const at::Tensor& bias, std::string_view approximate,
                                 at::Tensor& grad_input, at::Tensor& grad_bias,
                                 BiasGeluBackwardKernel kernel) {
  constexpr const char* op = "fuseops::bias_gelu_backward.out";
  const Activation activation = check_bias_gelu_backward(op, grad_output, input, bias, approximate);
  check_out(op, grad_input, "input", input, "grad_input");
  check_out(op, grad_bias, "bias", bias, "grad_bias");
  const std::initializer_list<NamedTensor> inputs = {
      {"grad_output", grad_output}, {"input", input}, {"bias", bias}};
  TORCH_CHECK(!share_memory(grad_input, grad_bias), op,
              ": arguments 'grad_input' and 'grad_bias' share memory; each result needs its "
              "own tensor");
  prepare_outputs(op, {{"grad_input", grad_input}}, input.sizes(), inputs);
  prepare_outputs(op, {{"grad_bias", grad_bias}}, bias.sizes(), inputs);
  if (kernel == nullptr) {
    return;
  }
  // Elementwise: grad_input may be exactly grad_output or input. The bias
  // gradient (a row sum) goes through a temporary.
  const at::Tensor contiguous_grad = grad_output.contiguous();
  const at::Tensor contiguous_input = input.contiguous();
  const at::Tensor bias_target = empty_contiguous_like(bias);
  fill_out(grad_input, {contiguous_grad, contiguous_input}, {bias, grad_bias},
           [&](const at::Tensor& target) {
             run_bias_gelu_backward(kernel, target, bias_target, contiguous_grad, contiguous_input,
                                    bias, activation);
           });
  grad_bias.copy_(bias_target);
}

}  // namespace detail

// C++ API: through the dispatcher, so autograd and the device kernels apply.
// Undefined tensors carry no dispatch key, so they are rejected here, before
// the dispatcher would fail with a message that names no argument.
at::Tensor gelu(const at::Tensor& input, std::string_view approximate) {
  check_floating_input("fuseops::gelu", "input", input);
  static auto op = detail::find_op<decltype(gelu)>("fuseops::gelu");
  return op.call(input, approximate);
}

at::Tensor& gelu_out(const at::Tensor& input, std::string_view approximate, at::Tensor& out) {
  check_floating_input("fuseops::gelu.out", "input", input);
  check_out("fuseops::gelu.out", out, "input", input);
  static auto op = detail::find_out_op<decltype(gelu_out)>("fuseops::gelu", "out");
  op.call(input, approximate, out);
  return out;
}

at::Tensor gelu_backward(const at::Tensor& grad_output, const at::Tensor& input,
                         std::string_view approximate) {
  check_floating_input("fuseops::gelu_backward", "grad_output", grad_output);
  check_floating_input("fuseops::gelu_backward", "input", input);
  static auto op = detail::find_op<decltype(gelu_backward)>("fuseops::gelu_backward");
  return op.call(grad_output, input, approximate);
}

at::Tensor& gelu_backward_out(const at::Tensor& grad_output, const at::Tensor& input,
                              std::string_view approximate, at::Tensor& out) {
  constexpr const char* name = "fuseops::gelu_backward.out";
  check_floating_input(name, "grad_output", grad_output);
  check_floating_input(name, "input", input);
  check_out(name, out, "input", input);
  static auto op =
      detail::find_out_op<decltype(gelu_backward_out)>("fuseops::gelu_backward", "out");
  op.call(grad_output, input, approximate, out);
  return out;
}

at::Tensor silu(const at::Tensor& input) {
  check_floating_input("fuseops::silu", "input", input);
  static auto op = detail::find_op<decltype(silu)>("fuseops::silu");
  return op.call(input);
}

at::Tensor& silu_out(const at::Tensor& input, at::Tensor& out) {
  check_floating_input("fuseops::silu.out", "input", input);
  check_out("fuseops::silu.out", out, "input", input);
  static auto op = detail::find_out_op<decltype(silu_out)>("fuseops::silu", "out");
  op.call(input, out);
  return out;
}

at::Tensor silu_backward(const at::Tensor& grad_output, const at::Tensor& input) {
  check_floating_input("fuseops::silu_backward", "grad_output", grad_output);
  check_floating_input("fuseops::silu_backward", "input", input);
  static auto op = detail::find_op<decltype(silu_backward)>("fuseops::silu_backward");
  return op.call(grad_output, input);
}

at::Tensor& silu_backward_out(const at::Tensor& grad_output, const at::Tensor& input,
                              at::Tensor& out) {
  constexpr const char* name = "fuseops::silu_backward.out";
  check_floating_input(name, "grad_output", grad_output);
  check_floating_input(name, "input", input);
  check_out(name, out, "input", input);
  static auto op =
      detail::find_out_op<decltype(silu_backward_out)>("fuseops::silu_backward", "out");
  op.call(grad_output, input, out);
  return out;
}

at::Tensor bias_gelu(const at::Tensor& input, const at::Tensor& bias,
                     std::string_view approximate) {
  check_floating_input("fuseops::bias_gelu", "input", input);
  check_floating_input("fuseops::bias_gelu", "bias", bias);
  static auto op = detail::find_op<decltype(bias_gelu)>("fuseops::bias_gelu");
  return op.call(input, bias, approximate);
}

at::Tensor& bias_gelu_out(const at::Tensor& input, const at::Tensor& bias,
                          std::string_view approximate, at::Tensor& out) {
  check_floating_input("fuseops::bias_gelu.out", "input", input);
  check_floating_input("fuseops::bias_gelu.out", "bias", bias);
  check_out("fuseops::bias_gelu.out", out, "input", input);
  static auto op = detail::find_out_op<decltype(bias_gelu_out)>("fuseops::bias_gelu", "out");
  op.call(input, bias, approximate, out);
  return out;
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& grad_output,
                                                      const at::Tensor& input,
                                                      const at::Tensor& bias,
                                                      std::string_view approximate) {
  constexpr const char* name = "fuseops::bias_gelu_backward";
  check_floating_input(name, "grad_output", grad_output);
  check_floating_input(name, "input", input);
  check_floating_input(name, "bias", bias);
  static auto op = detail::find_op<decltype(bias_gelu_backward)>(name);
  return op.call(grad_output, input, bias, approximate);
}

void bias_gelu_backward_out(const at::Tensor& grad_output, const at::Tensor& input,
                            const at::Tensor& bias, std::string_view approximate,
                            at::Tensor& grad_input, at::Tensor& grad_bias) {
  constexpr const char* name = "fuseops::bias_gelu_backward.out";
  check_floating_input(name, "grad_output", grad_output);
  check_floating_input(name, "input", input);
  check_floating_input(name, "bias", bias);
  check_out(name, grad_input, "input", input, "grad_input");
  check_out(name, grad_bias, "bias", bias, "grad_bias");
  static auto op =
      detail::find_op<decltype(bias_gelu_backward_out)>("fuseops::bias_gelu_backward", "out");
  op.call(grad_output, input, bias, approximate, grad_input, grad_bias);
}

// Autocast as torch's gelu(input + bias): the add promotes mixed inputs;
// gelu and silu take one tensor and fall through, as torch's do.
FUSEOPS_AUTOCAST(bias_gelu, kPromote, kPromote)

}  // namespace fuseops
