// fuseops::relu: schema, C++ API, shared checks, and the CPU and Meta
// registrations. Kernels: cpp/ops/cpu/relu_kernel.cpp, cuda/relu_kernel.cu;
// autograd: cpp/ops/autograd/relu.cpp.

#include "ops/relu.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <fuseops/relu.h>

#include "ops/common/checks.h"

namespace fuseops {
namespace detail {
namespace {

at::Tensor empty_contiguous_like(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options());
}

}  // namespace

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
  if (writes_directly(out, {contiguous_input}, {})) {
    kernel(out, contiguous_input);
  } else {
    at::Tensor result = empty_contiguous_like(input);
    kernel(result, contiguous_input);
    out.copy_(result);
  }
  return out;
}

at::Tensor relu_backward_with(const at::Tensor& grad_output,
                              const at::Tensor& result,
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

}  // namespace detail

namespace cpu {
FUSEOPS_DEFINE_CPU_KERNEL(relu_kernel, detail::ReluKernel);
FUSEOPS_DEFINE_CPU_KERNEL(relu_backward_kernel, detail::ReluBackwardKernel);
}  // namespace cpu

// C++ API: through the dispatcher, so autograd and the device kernels apply.
// Undefined tensors carry no dispatch key, so they are rejected here, before
// the dispatcher would fail with a message that names no argument.
at::Tensor relu(const at::Tensor& input) {
  check_floating_input("fuseops::relu", "input", input);
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fuseops::relu", "")
                       .typed<at::Tensor(const at::Tensor&)>();
  return op.call(input);
}

at::Tensor& relu_out(const at::Tensor& input, at::Tensor& out) {
  check_floating_input("fuseops::relu.out", "input", input);
  check_out("fuseops::relu.out", out, "input", input);
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fuseops::relu", "out")
                       .typed<void(const at::Tensor&, at::Tensor&)>();
  op.call(input, out);
  return out;
}

at::Tensor relu_backward(const at::Tensor& grad_output, const at::Tensor& result) {
  check_floating_input("fuseops::relu_backward", "grad_output", grad_output);
  check_floating_input("fuseops::relu_backward", "result", result);
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fuseops::relu_backward", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(grad_output, result);
}

namespace {

at::Tensor relu_cpu(const at::Tensor& input) {
  return detail::relu_with(input, cpu::relu_kernel.get());
}
void relu_out_cpu(const at::Tensor& input, at::Tensor& out) {
  detail::relu_out_with(input, out, cpu::relu_kernel.get());
}
at::Tensor relu_backward_cpu(const at::Tensor& grad_output, const at::Tensor& result) {
  return detail::relu_backward_with(grad_output, result, cpu::relu_backward_kernel.get());
}

at::Tensor relu_meta(const at::Tensor& input) {
  return detail::relu_with(input, nullptr);
}
void relu_out_meta(const at::Tensor& input, at::Tensor& out) {
  detail::relu_out_with(input, out, nullptr);
}
at::Tensor relu_backward_meta(const at::Tensor& grad_output, const at::Tensor& result) {
  return detail::relu_backward_with(grad_output, result, nullptr);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fuseops, m) {
  m.def("relu(Tensor input) -> Tensor", {at::Tag::pt2_compliant_tag});
  // The out= overload returns nothing: torch.compile can functionalize a
  // custom op that mutates an argument, not one whose output aliases it.
  m.def("relu.out(Tensor input, *, Tensor(a!) out) -> ()", {at::Tag::pt2_compliant_tag});
  m.def("relu_backward(Tensor grad_output, Tensor result) -> Tensor",
        {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(fuseops, CPU, m) {
  m.impl("relu", TORCH_FN(relu_cpu));
  m.impl("relu.out", TORCH_FN(relu_out_cpu));
  m.impl("relu_backward", TORCH_FN(relu_backward_cpu));
}

TORCH_LIBRARY_IMPL(fuseops, Meta, m) {
  m.impl("relu", TORCH_FN(relu_meta));
  m.impl("relu.out", TORCH_FN(relu_out_meta));
  m.impl("relu_backward", TORCH_FN(relu_backward_meta));
}

}  // namespace fuseops
