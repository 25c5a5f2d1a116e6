#pragma once
// Internal pieces of the relu op shared by its backends.

#include <ATen/core/Tensor.h>

#include "ops/cpu/dispatch.h"

namespace fuseops::detail {

// Kernels receive contiguous tensors of one shape and dtype; outputs are
// already allocated.
using ReluKernel = void (*)(const at::Tensor& out, const at::Tensor& input);
using ReluBackwardKernel = void (*)(const at::Tensor& grad_input,
                                    const at::Tensor& grad_output,
                                    const at::Tensor& result);

// Checks, layout and allocation common to every backend; `kernel` fills the
// output (nullptr for the Meta backend, which only needs shapes).
at::Tensor relu_with(const at::Tensor& input, ReluKernel kernel);
at::Tensor& relu_out_with(const at::Tensor& input, at::Tensor& out, ReluKernel kernel);
at::Tensor relu_backward_with(const at::Tensor& grad_output,
                              const at::Tensor& result,
                              ReluBackwardKernel kernel);

}  // namespace fuseops::detail

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(relu_kernel, detail::ReluKernel);
FUSEOPS_DECLARE_CPU_KERNEL(relu_backward_kernel, detail::ReluBackwardKernel);
}  // namespace fuseops::cpu
