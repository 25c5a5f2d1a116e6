#pragma once

#include <ATen/core/Tensor.h>

namespace fuseops {

// max(input, 0) elementwise; NaN propagates. Differentiable (C++ autograd).
// The result is contiguous, with the shape of `input`.
at::Tensor relu(const at::Tensor& input);

// relu into a preallocated `out` (resized to input's shape if it differs).
// Not differentiable, like every out= op.
at::Tensor& relu_out(const at::Tensor& input, at::Tensor& out);

// Gradient of relu: grad_output where result > 0, else 0 (NaN results pass
// the gradient through, as ATen's threshold_backward does).
at::Tensor relu_backward(const at::Tensor& grad_output, const at::Tensor& result);

// relu_backward into a preallocated `grad_input`, which may be grad_output
// itself (computed in place). Not differentiable, like every out= op.
at::Tensor& relu_backward_out(const at::Tensor& grad_output, const at::Tensor& result,
                              at::Tensor& grad_input);

}  // namespace fuseops
