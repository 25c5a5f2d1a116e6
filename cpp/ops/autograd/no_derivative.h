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
// device kernel and break that promise silently. Each operator's kind is
// declared in its family's cpp/ops/<op>.yaml (`autograd:`: function,
// no_derivative or inference), and the refusing kernels below are registered
// by code generated from it. tests_py/test_conformance.py holds every
// backward op it finds in the conformance samples to this policy.

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string_view>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

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

inline void check_no_derivative(const char* op, bool records) {
  TORCH_CHECK(!records, op,
              " is not differentiable (no double backward through the op it is the "
              "backward of): call it under torch.no_grad() or on tensors that do not "
              "require grad");
}
inline void check_no_derivative(const char* op,
                                std::initializer_list<std::optional<at::Tensor>> inputs) {
  check_no_derivative(op, records_grad(inputs));
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

inline void check_inference(const char* op, bool records) {
  TORCH_CHECK(!records, op,
              " is an inference op with no derivative: call it under torch.no_grad() or "
              "torch.inference_mode(), or on tensors that do not require grad");
}
inline void check_inference(const char* op,
                            std::initializer_list<std::optional<at::Tensor>> inputs) {
  check_inference(op, records_grad(inputs));
}

// The Autograd kernel of an op that has no derivative is always the same:
// refuse a call that would record a gradient (check_inference or
// check_no_derivative over every tensor argument), then run the op below
// autograd. register_inference / register_no_derivative register that
// kernel for a public fuseops function; the code generated from an
// `autograd:` entry `int8_weight_only_linear: inference` reads
//   register_inference<"fuseops::int8_weight_only_linear",
//                      &fuseops::int8_weight_only_linear>(m);
// The name is the one the refusal prints; without its "fuseops::" prefix it
// is the schema (and overload) name registered.

inline constexpr std::string_view kOpNamespace = "fuseops::";

// A string literal as a template argument: "fuseops::<schema name>".
template <std::size_t N>
struct OpName {
  char text[N];
  constexpr OpName(const char (&name)[N]) { std::copy_n(name, N, text); }
  constexpr bool qualified() const {
    return std::string_view(text, N - 1).starts_with(kOpNamespace);
  }
  constexpr const char* schema() const { return text + kOpNamespace.size(); }
};

inline bool argument_requires_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
inline bool argument_requires_grad(const std::optional<at::Tensor>& t) {
  return t.has_value() && argument_requires_grad(*t);
}
template <typename T>
bool argument_requires_grad(const T& /*not a tensor*/) {
  return false;
}

enum class NoGradient { inference, no_derivative };

template <OpName op, NoGradient policy, auto fn>
struct RefusingKernel;

template <OpName op, NoGradient policy, typename Result, typename... Args, Result (*fn)(Args...)>
struct RefusingKernel<op, policy, fn> {
  static_assert(op.qualified(), "an op name starts with \"fuseops::\"");
  static Result call(Args... args) {
    const bool records = at::GradMode::is_enabled() && (argument_requires_grad(args) || ...);
    if constexpr (policy == NoGradient::inference) {
      check_inference(op.text, records);
    } else {
      check_no_derivative(op.text, records);
    }
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return fn(args...);
  }
};

template <OpName op, auto fn>
void register_inference(torch::Library& m) {
  m.impl(op.schema(), TORCH_FN((RefusingKernel<op, NoGradient::inference, fn>::call)));
}

template <OpName op, auto fn>
void register_no_derivative(torch::Library& m) {
  m.impl(op.schema(), TORCH_FN((RefusingKernel<op, NoGradient::no_derivative, fn>::call)));
}

}  // namespace fuseops::autograd_detail
