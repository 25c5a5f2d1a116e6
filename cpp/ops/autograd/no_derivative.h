#pragma once
// The one double-backward policy of every op (python/README.md, "Gradients of
// the backward ops"). Each `<op>_backward` registers an Autograd kernel that does
// one of two things:
//  - it has a derivative: a torch::autograd::Function whose backward calls
//    differentiable ops (relu_backward, gelu_backward, silu_backward), or
//    the forward's Function differentiates an ATen composite of the gradient
//    under create_graph (rms_norm, fused_add_rms_norm);
//  - it has none: it calls check_no_derivative first (bias_gelu_backward,
//    swiglu_backward, geglu_backward, rms_norm_backward,
//    fused_add_rms_norm_backward, layer_norm_backward). Called while a
//    gradient would be recorded -- grad mode on and an input requiring grad,
//    as in double backward with create_graph=True or a direct call on
//    tensors that require grad -- it raises at once, naming the op, instead
//    of returning a result whose gradient would silently be None.
// Inference-only ops (the quantize, pack and quantized linear ops) have no
// derivative at all: their Autograd kernels call check_inference first, with
// the same refusal.
// A backward op with no Autograd kernel at all would fall through to its
// device kernel and break that promise silently. tests_py/test_conformance.py
// holds every backward op it finds in the conformance samples to this policy.

#include <initializer_list>
#include <optional>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

namespace fuseops::autograd_detail {

// Whether a call with these inputs records a gradient: grad mode is on and a
// defined input requires grad. Forwards that skip their Function otherwise
// save nothing for a backward that will not run.
inline bool records_grad(std::initializer_list<std::optional<at::Tensor>> inputs) {
  if (!at::GradMode::is_enabled()) {
    return false;
  }
  for (const std::optional<at::Tensor>& t : inputs) {
    if (t.has_value() && t->defined() && t->requires_grad()) {
      return true;
    }
  }
  return false;
}

inline void check_no_derivative(const char* op,
                                std::initializer_list<std::optional<at::Tensor>> inputs) {
  TORCH_CHECK(!records_grad(inputs), op,
              " is not differentiable (no double backward through the op it is the "
              "backward of): call it under torch.no_grad() or on tensors that do not "
              "require grad");
}

// For the backward of an op that computes its gradients in the forward
// (cross_entropy_inplace, linear_cross_entropy, fused_linear_jsd): those
// gradients carry no graph of their own, so a backward with
// create_graph=True would silently drop the second derivative.
inline void check_not_recording(const char* op) {
  TORCH_CHECK(!at::GradMode::is_enabled(), op,
              " has no second derivative (its gradients are computed in the forward): "
              "backward with create_graph=True is not supported");
}

inline void check_inference(const char* op,
                            std::initializer_list<std::optional<at::Tensor>> inputs) {
  TORCH_CHECK(!records_grad(inputs), op,
              " is an inference op with no derivative: call it under torch.no_grad() or "
              "torch.inference_mode(), or on tensors that do not require grad");
}

}  // namespace fuseops::autograd_detail
