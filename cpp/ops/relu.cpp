// fuseops::relu: the C++ API, the shared checks and the `*_with` entry points
// that every backend's kernels go through. The schemas and the Meta, CPU and
// CUDA registrations are generated from cpp/ops/relu.yaml. CPU kernels:
// cpp/ops/cpu/relu_kernel.cpp; CUDA: cuda/relu_kernel.cu; autograd:
// cpp/ops/autograd/relu.cpp.

#include "ops/relu.h"

#include <torch/library.h>

#include <fuseops/relu.h>

#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/tensors.h"

namespace fuseops {
namespace detail {

at::Tensor relu_with(const at::Tensor& input, ReluKernel kernel) {
  check_floating_input("fuseops::relu", "input", input);
  at::Tensor out = empty_contiguous_like(input);
  if (kernel != nullptr && input.numel() > 0) {
    kernel(out, input.contiguous());
  }
  return out;
}

at::Tensor& relu_out_with(const at::Tensor& input, at::Tensor& out, ReluKernel kernel) {
  check_floating_input("fuseops::relu.out", "input", input);
  check_out("fuseops::relu.out", out, "input", input);
  prepare_outputs("fuseops::relu.out", {{"out", out}}, input.sizes(), {{"input", input}});
  if (kernel == nullptr || input.numel() == 0) {
    return out;
  }
  const at::Tensor contiguous_input = input.contiguous();
  fill_out(out, {contiguous_input}, {},
           [&](const at::Tensor& target) { kernel(target, contiguous_input); });
  return out;
}

at::Tensor relu_backward_with(const at::Tensor& grad_output, const at::Tensor& result,
                              ReluBackwardKernel kernel) {
  constexpr const char* op = "fuseops::relu_backward";
  check_floating_input(op, "grad_output", grad_output);
  check_floating_input(op, "result", result);
  check_same_dtype(op, "grad_output", grad_output, "result", result);
  check_same_device(op, "grad_output", grad_output, "result", result);
  check_same_shape(op, "grad_output", grad_output, "result", result);
  at::Tensor grad_input = empty_contiguous_like(result);
  if (kernel != nullptr && result.numel() > 0) {
    kernel(grad_input, grad_output.contiguous(), result.contiguous());
  }
  return grad_input;
}

at::Tensor& relu_backward_out_with(const at::Tensor& grad_output, const at::Tensor& result,
                                   at::Tensor& grad_input, ReluBackwardKernel kernel) {
  constexpr const char* op = "fuseops::relu_backward.out";
  check_floating_input(op, "grad_output", grad_output);
  check_floating_input(op, "result", result);
  check_same_dtype(op, "grad_output", grad_output, "result", result);
  check_same_device(op, "grad_output", grad_output, "result", result);
  check_same_shape(op, "grad_output", grad_output, "result", result);
  check_out(op, grad_input, "result", result);
  prepare_outputs(op, {{"out", grad_input}}, result.sizes(),
                  {{"grad_output", grad_output}, {"result", result}});
  if (kernel == nullptr || result.numel() == 0) {
    return grad_input;
  }
  const at::Tensor contiguous_grad = grad_output.contiguous();
  const at::Tensor contiguous_result = result.contiguous();
  // Elementwise: grad_input may be exactly grad_output or result.
  fill_out(grad_input, {contiguous_grad, contiguous_result}, {},
           [&](const at::Tensor& target) { kernel(target, contiguous_grad, contiguous_result); });
  return grad_input;
}

}  // namespace detail

// C++ API: through the dispatcher, so autograd and the device kernels apply.
// Undefined tensors carry no dispatch key, so they are rejected here, before
// the dispatcher would fail with a message that names no argument.
at::Tensor relu(const at::Tensor& input) {
  check_floating_input("fuseops::relu", "input", input);
  static auto op = detail::find_op<decltype(relu)>("fuseops::relu");
  return op.call(input);
}

at::Tensor& relu_out(const at::Tensor& input, at::Tensor& out) {
  check_floating_input("fuseops::relu.out", "input", input);
  check_out("fuseops::relu.out", out, "input", input);
  static auto op = detail::find_out_op<decltype(relu_out)>("fuseops::relu", "out");
  op.call(input, out);
  return out;
}

at::Tensor relu_backward(const at::Tensor& grad_output, const at::Tensor& result) {
  check_floating_input("fuseops::relu_backward", "grad_output", grad_output);
  check_floating_input("fuseops::relu_backward", "result", result);
  static auto op = detail::find_op<decltype(relu_backward)>("fuseops::relu_backward");
  return op.call(grad_output, result);
}

at::Tensor& relu_backward_out(const at::Tensor& grad_output, const at::Tensor& result,
                              at::Tensor& grad_input) {
  constexpr const char* name = "fuseops::relu_backward.out";
  check_floating_input(name, "grad_output", grad_output);
  check_floating_input(name, "result", result);
  check_out(name, grad_input, "result", result);
  static auto op =
      detail::find_out_op<decltype(relu_backward_out)>("fuseops::relu_backward", "out");
  op.call(grad_output, result, grad_input);
  return grad_input;
}

}  // namespace fuseops
