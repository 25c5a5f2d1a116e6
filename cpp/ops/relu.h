#pragma once
// relu's contract between its shared entry points and its kernels. Every
// backend (CPU, CUDA, Meta) registers the same entry points with its own
// kernels, so checks, layout and allocation cannot differ between them.

#include <ATen/core/Tensor.h>

#include "ops_generated/relu.h"

namespace fuseops::detail {

// Kernels receive contiguous tensors of one shape and dtype; outputs are
// already allocated.
using ReluKernel = void (*)(const at::Tensor& out, const at::Tensor& input);
using ReluBackwardKernel = void (*)(const at::Tensor& grad_input, const at::Tensor& grad_output,
                                    const at::Tensor& result);

// Checks, layout and allocation common to every backend; `kernel` fills the
// output (nullptr for the Meta backend, which only needs shapes).
at::Tensor relu_with(const at::Tensor& input, ReluKernel kernel);
at::Tensor& relu_out_with(const at::Tensor& input, at::Tensor& out, ReluKernel kernel);
at::Tensor relu_backward_with(const at::Tensor& grad_output, const at::Tensor& result,
                              ReluBackwardKernel kernel);
at::Tensor& relu_backward_out_with(const at::Tensor& grad_output, const at::Tensor& result,
                                   at::Tensor& grad_input, ReluBackwardKernel kernel);

// The dispatcher entry points of one backend, whose `Kernels::forward()` and
// `Kernels::backward()` return its kernels.
template <typename Kernels>
struct ReluRegistrations {
  static at::Tensor relu(const at::Tensor& input) { return relu_with(input, Kernels::forward()); }
  static void relu_out(const at::Tensor& input, at::Tensor& out) {
    relu_out_with(input, out, Kernels::forward());
  }
  static at::Tensor relu_backward(const at::Tensor& grad_output, const at::Tensor& result) {
    return relu_backward_with(grad_output, result, Kernels::backward());
  }
  static void relu_backward_out(const at::Tensor& grad_output, const at::Tensor& result,
                                at::Tensor& grad_input) {
    relu_backward_out_with(grad_output, result, grad_input, Kernels::backward());
  }

  // The operators of cpp/ops/relu.yaml's `ops:`, each with the function of
  // the same name.
  template <typename Library>
  static void register_all(Library& m) {
    register_relu_kernels<ReluRegistrations>(m);
  }
};

}  // namespace fuseops::detail
