#pragma once

#include <string_view>
#include <tuple>

#include <ATen/core/Tensor.h>

namespace fuseops {

// GELU, as torch.nn.functional.gelu: approximate "none" is the exact form
// x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2))); "tanh" is
// 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))). Any other string
// is an error. Differentiable (C++ autograd); the result is contiguous.
at::Tensor gelu(const at::Tensor& input, std::string_view approximate = "none");

// gelu into a preallocated `out` (resized to input's shape if it differs).
// Not differentiable, like every out= op.
at::Tensor& gelu_out(const at::Tensor& input, std::string_view approximate, at::Tensor& out);

// grad_output * d gelu(input) / d input.
at::Tensor gelu_backward(const at::Tensor& grad_output, const at::Tensor& input,
                         std::string_view approximate = "none");
// gelu_backward into a preallocated `out`, which may be grad_output itself
// (computed in place). Not differentiable, like every out= op.
at::Tensor& gelu_backward_out(const at::Tensor& grad_output, const at::Tensor& input,
                              std::string_view approximate, at::Tensor& out);

// SiLU (swish), as torch.nn.functional.silu: x * sigmoid(x). Differentiable.
at::Tensor silu(const at::Tensor& input);
at::Tensor& silu_out(const at::Tensor& input, at::Tensor& out);

// grad_output * d silu(input) / d input.
at::Tensor silu_backward(const at::Tensor& grad_output, const at::Tensor& input);
at::Tensor& silu_backward_out(const at::Tensor& grad_output, const at::Tensor& input,
                              at::Tensor& out);

// gelu(input + bias) in one pass, bias (1-D, size input.size(-1)) broadcast
// over the rows, as Megatron's and apex's bias-GELU. Differentiable in both.
at::Tensor bias_gelu(const at::Tensor& input, const at::Tensor& bias,
                     std::string_view approximate = "none");
at::Tensor& bias_gelu_out(const at::Tensor& input, const at::Tensor& bias,
                          std::string_view approximate, at::Tensor& out);

// (grad_input, grad_bias) of bias_gelu: grad_input = grad_output *
// gelu'(input + bias), grad_bias its sum over all rows (float32 accumulation
// for bfloat16/float16), both in one pass over the data.
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& grad_output,
                                                      const at::Tensor& input,
                                                      const at::Tensor& bias,
                                                      std::string_view approximate = "none");

// bias_gelu_backward into preallocated tensors (resized to input's and
// bias's shapes); grad_input may be grad_output or input itself (computed
// in place). Not differentiable, like every out= op.
void bias_gelu_backward_out(const at::Tensor& grad_output, const at::Tensor& input,
                            const at::Tensor& bias, std::string_view approximate,
                            at::Tensor& grad_input, at::Tensor& grad_bias);

}  // namespace fuseops
