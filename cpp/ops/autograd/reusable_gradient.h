#pragma once
// Backward kernels that write their input gradient into the gradient
// autograd hands them, instead of a fresh tensor of the same size.
//
// Every fresh output costs its first touch: large ones come from a new
// mapping, page-faulted in as they are written (python/README.md). The
// gradient flowing into an elementwise or row-wise backward is, in
// training, usually a fresh tensor nothing else refers to (the output of
// the next layer's backward), dead once read. A backward that is its sole
// owner may write the result over it -- the kernels read element i (or its
// whole row) before writing element i, which the out= overloads' aliasing
// rule (cpp/ops/common/checks.h, writes_directly) allows -- and saves one
// allocation of the activation's size per op per step. AccumulateGrad
// steals a uniquely owned gradient for `.grad` the same way.

#include <utility>

#include <ATen/CachedTensorUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/variable.h>

#include "ops/common/checks.h"

namespace fuseops::autograd_detail {

// Whether `grad` -- moved out of the backward's arguments, so that this
// reference is the caller's own -- may be overwritten with a gradient shaped
// like `like`. Only when nothing else can observe it:
//  - no other reference to the tensor or its storage (a hook, retain_grad(),
//    a user holding it, a view of the same memory: any of these keeps a
//    count above one), as AccumulateGrad decides;
//  - grad mode off: with create_graph the gradient is part of a graph;
//  - a plain dense CPU or CUDA tensor: no tensor subclass, dispatch mode,
//    functionalization or tracing (those record the call and would see an
//    out= op where the graph has none), no inference tensor (not writable
//    outside inference mode);
//  - contiguous, with the result's dtype, device and shape, as the fresh
//    output would have been. An undefined `like` stands for a result
//    shaped like `grad` itself (rope's backward, a rotation of it).
inline bool reusable_gradient(const at::Tensor& grad, const at::Tensor& like) {
  // is_tensor_stealable: one reference, or two where the second is the
  // tensor's Python object and nothing in Python refers to that (AccumulateGrad's
  // rule for taking a gradient as `.grad` without a copy).
  if (!grad.defined() || at::GradMode::is_enabled() ||
      !torch::autograd::impl::is_tensor_stealable(grad) || !grad.has_storage() ||
      grad.storage().use_count() != 1) {
    return false;
  }
  // Keys of wrappers and lazy views: writing through them is not writing
  // the values the tensor shows (negative/conjugate bits, zero tensors), or
  // is seen by something that records calls.
  constexpr c10::DispatchKeySet kForeign(
      {c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
       c10::DispatchKey::Functionalize, c10::DispatchKey::FuncTorchBatched,
       c10::DispatchKey::FuncTorchGradWrapper, c10::DispatchKey::FuncTorchDynamicLayerFrontMode,
       c10::DispatchKey::FuncTorchDynamicLayerBackMode, c10::DispatchKey::Negative,
       c10::DispatchKey::Conjugate, c10::DispatchKey::ZeroTensor});
  if (grad.key_set().has_any(kForeign) || c10::impl::TorchDispatchModeTLS::stack_len() > 0 ||
      grad.unsafeGetTensorImpl()->is_python_dispatch() || grad.is_inference() || grad.is_nested() ||
      grad.layout() != at::kStrided || at::caching::is_cached_tensor(grad) ||
      !(grad.device().is_cpu() || grad.device().is_cuda())) {
    return false;
  }
  if (!like.defined()) {
    return grad.is_contiguous();
  }
  return grad.is_contiguous() && grad.scalar_type() == like.scalar_type() &&
         grad.device() == like.device() && grad.sizes() == like.sizes() &&
         !share_memory(grad, like);
}

// The input gradient of a backward that may write over its incoming
// gradient. The gradient is moved out of autograd's `slot` (a backward
// taking `grads` by reference), so that this reference is the caller's own;
// when reusable_gradient(grad, like) allows it, `write(grad)` computes the
// result over it through the op's out= overload (and any other gradient
// into tensors it allocates) and `grad` is returned; otherwise
// `allocate(grad)` returns the gradient in a new tensor.
template <typename Write, typename Allocate>
at::Tensor gradient_over(at::Tensor& slot, const at::Tensor& like, const Write& write,
                         const Allocate& allocate) {
  at::Tensor grad = std::move(slot);
  if (reusable_gradient(grad, like)) {
    write(grad);
    return grad;
  }
  return allocate(grad);
}

}  // namespace fuseops::autograd_detail
