#pragma once
// The one policy for ops that have no derivative of their own: the fused
// backward ops bias_gelu_backward, swiglu_backward, geglu_backward,
// rms_norm_backward, fused_add_rms_norm_backward and layer_norm_backward.
// (relu_backward, gelu_backward and silu_backward do have one: double
// backward through relu, gelu and silu works; rms_norm and
// fused_add_rms_norm differentiate an ATen composite under create_graph.)
// Calling such an op while a gradient would be recorded -- grad mode on and
// an input requiring grad, as in double backward with create_graph=True or a
// direct call on tensors that require grad -- raises at once, naming the op,
// instead of returning a result whose gradient would silently be None.

#include <initializer_list>
#include <optional>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

namespace fuseops::autograd_detail {

inline void check_no_derivative(const char* op,
                                std::initializer_list<std::optional<at::Tensor>> inputs) {
  if (!at::GradMode::is_enabled()) {
    return;
  }
  for (const std::optional<at::Tensor>& t : inputs) {
    TORCH_CHECK(!(t.has_value() && t->defined() && t->requires_grad()), op,
                " is not differentiable (no double backward through the op it is the "
                "backward of): call it under torch.no_grad() or on tensors that do not "
                "require grad");
  }
}

}  // namespace fuseops::autograd_detail
