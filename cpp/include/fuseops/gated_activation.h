#pragma once
// Gated MLP activations (SwiGLU, GeGLU). Each comes in two forms:
//  - separate halves: `gate` and `up` of one shape [..., H];
//  - packed: one `input` of shape [..., 2*H] whose last dimension holds the
//    gate in its first half and the up projection in its second half
//    (input[..., :H] is the gate, input[..., H:] is up).
// Results have shape [..., H] and are contiguous.

#include <string_view>
#include <tuple>

#include <ATen/core/Tensor.h>

namespace fuseops {

// silu(gate) * up. Differentiable in both (C++ autograd).
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);
at::Tensor& swiglu_out(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out);
// (grad_gate, grad_up) in one pass.
std::tuple<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad_output,
                                                   const at::Tensor& gate, const at::Tensor& up);
// swiglu_backward into preallocated tensors; either may be grad_output,
// gate or up itself (computed in place). Not differentiable.
void swiglu_backward_out(const at::Tensor& grad_output, const at::Tensor& gate,
                         const at::Tensor& up, at::Tensor& grad_gate, at::Tensor& grad_up);

// swiglu of a packed [..., 2*H] input (gate first, up second).
at::Tensor swiglu_packed(const at::Tensor& input);
at::Tensor& swiglu_packed_out(const at::Tensor& input, at::Tensor& out);
// Gradient w.r.t. the packed input, packed the same way ([..., 2*H]).
at::Tensor swiglu_packed_backward(const at::Tensor& grad_output, const at::Tensor& input);

// gelu(gate, approximate) * up; approximate is "none" or "tanh" as in gelu.
at::Tensor geglu(const at::Tensor& gate, const at::Tensor& up,
                 std::string_view approximate = "none");
at::Tensor& geglu_out(const at::Tensor& gate, const at::Tensor& up, std::string_view approximate,
                      at::Tensor& out);
std::tuple<at::Tensor, at::Tensor> geglu_backward(const at::Tensor& grad_output,
                                                  const at::Tensor& gate, const at::Tensor& up,
                                                  std::string_view approximate = "none");
void geglu_backward_out(const at::Tensor& grad_output, const at::Tensor& gate, const at::Tensor& up,
                        std::string_view approximate, at::Tensor& grad_gate, at::Tensor& grad_up);

at::Tensor geglu_packed(const at::Tensor& input, std::string_view approximate = "none");
at::Tensor& geglu_packed_out(const at::Tensor& input, std::string_view approximate,
                             at::Tensor& out);
at::Tensor geglu_packed_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                 std::string_view approximate = "none");

}  // namespace fuseops
