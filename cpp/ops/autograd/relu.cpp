// Autograd for fuseops::relu, registered in C++ so LibTorch programs get
// gradients without Python. relu_backward is itself differentiable (its
// gradient w.r.t. grad_output is relu_backward again), so double backward
// and gradgradcheck work.

#include <torch/library.h>

#include <fuseops/relu.h>

#include "ops/autograd/function.h"
#include "ops/autograd/reusable_gradient.h"
#include "ops/common/checks.h"
#include "ops_generated/autograd/relu.h"

namespace fuseops {
namespace {

class ReluBackwardFunction : public torch::autograd::Function<ReluBackwardFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad_output,
                            const at::Tensor& result) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({result});
    return fuseops::relu_backward(grad_output, result);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor result = ctx->get_saved_variables()[0];
    // The mask depends on `result` only through a step function: its
    // gradient w.r.t. result is zero almost everywhere.
    return {fuseops::relu_backward(grads[0], result), at::Tensor()};
  }
};

class ReluFunction : public torch::autograd::Function<ReluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    at::Tensor result = fuseops::relu(input);
    ctx->save_for_backward({result});
    return result;
  }

  // `grads` by reference: the gradient is moved out, so that a sole owner
  // can be overwritten (autograd/reusable_gradient.h).
  static variable_list backward(AutogradContext* ctx, variable_list& grads) {
    const at::Tensor result = ctx->get_saved_variables()[0];
    return {autograd_detail::gradient_over(
        grads[0], result, [&](at::Tensor& grad) { fuseops::relu_backward_out(grad, result, grad); },
        [&](const at::Tensor& grad) { return ReluBackwardFunction::apply(grad, result); })};
  }
};

// The Autograd kernels cpp/ops/relu.yaml declares as functions.
struct ReluAutograd {
  // Function::apply fails on an undefined tensor with a message naming
  // nothing, so the tensors are checked first.
  static at::Tensor relu(const at::Tensor& input) {
    check_floating_input("fuseops::relu", "input", input);
    return ReluFunction::apply(input);
  }

  static at::Tensor relu_backward(const at::Tensor& grad_output, const at::Tensor& result) {
    check_floating_input("fuseops::relu_backward", "grad_output", grad_output);
    check_floating_input("fuseops::relu_backward", "result", result);
    return ReluBackwardFunction::apply(grad_output, result);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) { detail::register_relu_autograd<ReluAutograd>(m); }

}  // namespace fuseops
