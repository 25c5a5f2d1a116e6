// Autograd for fuseops::swiglu and geglu (separate and packed), registered in
// C++ so LibTorch programs get gradients without Python. The backward ops
// are not differentiable: differentiating through them raises an error
// instead of returning a silently wrong gradient.

#include <string>

#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <fuseops/gated_activation.h>

namespace fuseops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// `approximate` is empty for swiglu, the GELU form for geglu.
class GatedFunction : public torch::autograd::Function<GatedFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            const std::string& approximate) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({gate, up});
    ctx->saved_data["approximate"] = approximate;
    return approximate.empty() ? fuseops::swiglu(gate, up)
                               : fuseops::geglu(gate, up, approximate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    auto [grad_gate, grad_up] =
        approximate.empty() ? fuseops::swiglu_backward(grads[0], saved[0], saved[1])
                            : fuseops::geglu_backward(grads[0], saved[0], saved[1], approximate);
    return {grad_gate, grad_up, at::Tensor()};
  }
};

class GatedPackedFunction : public torch::autograd::Function<GatedPackedFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            const std::string& approximate) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({input});
    ctx->saved_data["approximate"] = approximate;
    return approximate.empty() ? fuseops::swiglu_packed(input)
                               : fuseops::geglu_packed(input, approximate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor input = ctx->get_saved_variables()[0];
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    return {approximate.empty()
                ? fuseops::swiglu_packed_backward(grads[0], input)
                : fuseops::geglu_packed_backward(grads[0], input, approximate),
            at::Tensor()};
  }
};

at::Tensor swiglu_autograd(const at::Tensor& gate, const at::Tensor& up) {
  return GatedFunction::apply(gate, up, std::string());
}

at::Tensor swiglu_packed_autograd(const at::Tensor& input) {
  return GatedPackedFunction::apply(input, std::string());
}

// An empty `approximate` would mean swiglu, so it is rejected here with the
// same message the kernels give for any other unknown form.
std::string geglu_approximate(const char* op, c10::string_view approximate) {
  TORCH_CHECK(approximate == "none" || approximate == "tanh", op,
              ": argument 'approximate' must be 'none' or 'tanh', got '", approximate, "'");
  return std::string(approximate);
}

at::Tensor geglu_autograd(const at::Tensor& gate, const at::Tensor& up,
                          c10::string_view approximate) {
  return GatedFunction::apply(gate, up, geglu_approximate("fuseops::geglu", approximate));
}

at::Tensor geglu_packed_autograd(const at::Tensor& input, c10::string_view approximate) {
  return GatedPackedFunction::apply(input,
                                    geglu_approximate("fuseops::geglu.packed", approximate));
}

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  m.impl("swiglu", TORCH_FN(swiglu_autograd));
  m.impl("swiglu.packed", TORCH_FN(swiglu_packed_autograd));
  m.impl("geglu", TORCH_FN(geglu_autograd));
  m.impl("geglu.packed", TORCH_FN(geglu_packed_autograd));
  m.impl("swiglu_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("swiglu_backward.packed", torch::autograd::autogradNotImplementedFallback());
  m.impl("geglu_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("geglu_backward.packed", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace fuseops
