// Autograd for fuseops::linear, registered in C++ so LibTorch programs get
// gradients without Python. The gradients are ATen's matrix products, as in
// torch's own linear backward:
//   grad_input = grad @ weight, grad_weight = grad^T @ input,
//   grad_bias = grad summed over the rows,
// and ATen ops are differentiable, so double backward works. Where the
// forward runs widened (bfloat16/float16 products that ATen emulates), so do
// the products of a backward that builds no graph; a backward that builds
// one (create_graph) keeps ATen's, differentiable, products.

#include <ATen/core/grad_mode.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include <fuseops/linear.h>

#include "ops/autograd/function.h"
#include "ops/autograd/no_derivative.h"
#include "ops/common/checks.h"
#include "ops/common/output_memory.h"
#include "ops/common/widened_products.h"
#include "ops/linear.h"
#include "ops_generated/autograd/linear.h"

namespace fuseops {
namespace {

class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({input, weight});
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    return fuseops::linear(input, weight, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const int64_t k = weight.size(1);
    const int64_t n = weight.size(0);
    // Rows from the leading sizes (-1 is ambiguous when a size is 0).
    const int64_t rows = c10::multiply_integers(input.sizes().slice(0, input.dim() - 1));
    const at::Tensor grad = grads[0].reshape({rows, n});
    at::Tensor grad_input, grad_weight, grad_bias;
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) {
      grad_bias = grad.sum(0);
    }
    if (!at::GradMode::is_enabled() && detail::linear_runs_widened(weight, rows)) {
      if (ctx->needs_input_grad(0)) {
        grad_input = detail::empty_output({rows, k}, input.options());
      }
      if (ctx->needs_input_grad(1)) {
        grad_weight = detail::empty_output(weight.sizes(), weight.options());
      }
      detail::WidenedWeight widened(weight, rows);
      detail::widened_linear_backward(grad, input.reshape({rows, k}), widened, grad_input,
                                      grad_weight, /*accumulate=*/false, at::Tensor());
      return {grad_input.defined() ? grad_input.view(input.sizes()) : grad_input, grad_weight,
              grad_bias};
    }
    if (ctx->needs_input_grad(0)) {
      grad_input = at::mm(grad, weight).reshape(input.sizes());
    }
    if (ctx->needs_input_grad(1)) {
      grad_weight = at::mm(grad.t(), input.reshape({rows, k}));
    }
    return {grad_input, grad_weight, grad_bias};
  }
};

// The Autograd kernels cpp/ops/linear.yaml declares as functions.
struct LinearAutograd {
  static at::Tensor linear(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias) {
    // Without a gradient to record (decoding), no autograd node: the op's own
    // checks name it and the argument.
    if (!autograd_detail::records_grad({input, weight, bias})) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      return fuseops::linear(input, weight, bias);
    }
    // Function::apply fails on an undefined tensor with a message naming
    // nothing, so the tensors are checked first.
    check_floating_input("fuseops::linear", "input", input);
    check_floating_input("fuseops::linear", "weight", weight);
    return LinearFunction::apply(input, weight, bias);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) { detail::register_linear_autograd<LinearAutograd>(m); }

}  // namespace fuseops
