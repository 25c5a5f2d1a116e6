// Autograd for fuseops::swiglu and geglu (separate and packed), registered in
// C++ so LibTorch programs get gradients without Python. The backward ops
// are not differentiable (see autograd/no_derivative.h). Function::apply
// fails on an undefined tensor with a message naming nothing, so each
// kernel checks its tensors first.

#include <string>
#include <tuple>

#include <torch/library.h>

#include <fuseops/gated_activation.h>

#include "ops/autograd/function.h"
#include "ops/autograd/no_derivative.h"
#include "ops/autograd/reusable_gradient.h"
#include "ops/common/checks.h"
#include "ops/common/tensors.h"
#include "ops_generated/autograd/gated_activation.h"

namespace fuseops {
namespace {

// `approximate` is empty for swiglu, the GELU form for geglu.
class GatedFunction : public torch::autograd::Function<GatedFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            const std::string& approximate) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({gate, up});
    autograd_detail::save_approximate(ctx, approximate);
    return approximate.empty() ? fuseops::swiglu(gate, up) : fuseops::geglu(gate, up, approximate);
  }

  // `grads` by reference: the gradient is moved out, so that a sole owner
  // can be overwritten with the gate's gradient (autograd/reusable_gradient.h).
  static variable_list backward(AutogradContext* ctx, variable_list& grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& gate = saved[0];
    const at::Tensor& up = saved[1];
    const std::string approximate = autograd_detail::saved_approximate(ctx);
    at::Tensor grad_up;
    at::Tensor grad_gate = autograd_detail::gradient_over(
        grads[0], gate,
        [&](at::Tensor& grad) {
          grad_up = detail::empty_contiguous_like(grad);
          if (approximate.empty()) {
            fuseops::swiglu_backward_out(grad, gate, up, grad, grad_up);
          } else {
            fuseops::geglu_backward_out(grad, gate, up, approximate, grad, grad_up);
          }
        },
        [&](const at::Tensor& grad) {
          at::Tensor grad_gate;
          std::tie(grad_gate, grad_up) = approximate.empty()
                                             ? fuseops::swiglu_backward(grad, gate, up)
                                             : fuseops::geglu_backward(grad, gate, up, approximate);
          return grad_gate;
        });
    return {grad_gate, grad_up, at::Tensor()};
  }
};

class GatedPackedFunction : public torch::autograd::Function<GatedPackedFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            const std::string& approximate) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({input});
    autograd_detail::save_approximate(ctx, approximate);
    return approximate.empty() ? fuseops::swiglu_packed(input)
                               : fuseops::geglu_packed(input, approximate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor input = ctx->get_saved_variables()[0];
    const std::string approximate = autograd_detail::saved_approximate(ctx);
    return {approximate.empty() ? fuseops::swiglu_packed_backward(grads[0], input)
                                : fuseops::geglu_packed_backward(grads[0], input, approximate),
            at::Tensor()};
  }
};

// An empty `approximate` would mean swiglu, so it is rejected here with the
// same message the kernels give for any other unknown form.
std::string geglu_approximate(const char* op, c10::string_view approximate) {
  TORCH_CHECK(approximate == "none" || approximate == "tanh", op,
              ": argument 'approximate' must be 'none' or 'tanh', got '", approximate, "'");
  return std::string(approximate);
}

using TensorPair = std::tuple<at::Tensor, at::Tensor>;

// The Autograd kernels cpp/ops/gated_activation.yaml declares as functions.
struct GatedActivationAutograd {
  static at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
    check_floating_input("fuseops::swiglu", "gate", gate);
    check_floating_input("fuseops::swiglu", "up", up);
    return GatedFunction::apply(gate, up, std::string());
  }

  static at::Tensor swiglu_packed(const at::Tensor& input) {
    check_floating_input("fuseops::swiglu.packed", "input", input);
    return GatedPackedFunction::apply(input, std::string());
  }

  static at::Tensor geglu(const at::Tensor& gate, const at::Tensor& up,
                          c10::string_view approximate) {
    check_floating_input("fuseops::geglu", "gate", gate);
    check_floating_input("fuseops::geglu", "up", up);
    return GatedFunction::apply(gate, up, geglu_approximate("fuseops::geglu", approximate));
  }

  static at::Tensor geglu_packed(const at::Tensor& input, c10::string_view approximate) {
    check_floating_input("fuseops::geglu.packed", "input", input);
    return GatedPackedFunction::apply(input,
                                      geglu_approximate("fuseops::geglu.packed", approximate));
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  detail::register_gated_activation_autograd<GatedActivationAutograd>(m);
}

}  // namespace fuseops
