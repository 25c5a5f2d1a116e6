#pragma once

#include <optional>
#include <string_view>
#include <tuple>

#include <ATen/core/Tensor.h>

namespace fuseops {

// Depthwise causal 1-D convolution as Mamba uses it (the causal-conv1d
// package's causal_conv1d_fn): for x of shape (batch, dim, seqlen) and weight
// (dim, width), width 2..4,
//   out[b, c, t] = act(bias[c] + sum_k weight[c, k] * x[b, c, t - (width-1) + k])
// where positions before t = 0 come from `initial_states` (batch, dim,
// width-1) or are zero, and act is the identity or SiLU
// (activation = "silu"). x may be contiguous or channel-last (x.stride(1) ==
// 1, a transposed (batch, seqlen, dim) tensor whose rows may be strided):
// both are read in place, other layouts are copied first; the result has x's
// layout class (contiguous, or channel-last dense). weight and bias have x's
// dtype, or float32 when x is bfloat16/float16; initial_states has x's dtype.
// bfloat16/float16 are computed in float32. Differentiable in x, weight,
// bias and initial_states (C++ autograd).
at::Tensor causal_conv1d(const at::Tensor& x, const at::Tensor& weight,
                         const std::optional<at::Tensor>& bias = std::nullopt,
                         const std::optional<at::Tensor>& initial_states = std::nullopt,
                         std::optional<std::string_view> activation = std::nullopt);

// causal_conv1d into a preallocated `out` (resized to x's shape if it
// differs). Not differentiable, like every out= op.
at::Tensor& causal_conv1d_out(const at::Tensor& x, const at::Tensor& weight,
                              const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& initial_states,
                              std::optional<std::string_view> activation, at::Tensor& out);

// causal_conv1d and its final states (batch, dim, width-1): the last width-1
// inputs of the sequence initial_states ++ x (zeros for absent initial
// states), what a later call takes as initial_states. Both results are
// differentiable.
std::tuple<at::Tensor, at::Tensor> causal_conv1d_forward(
    const at::Tensor& x, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias = std::nullopt,
    const std::optional<at::Tensor>& initial_states = std::nullopt,
    std::optional<std::string_view> activation = std::nullopt);

// Gradients of causal_conv1d_forward: (grad_x, grad_weight, grad_bias,
// grad_initial_states) given grad_output and, optionally, the gradient of
// the final states. grad_weight/grad_bias are reduced in float32 (float64
// for float64) in a fixed order and have weight's dtype; grad_bias and
// grad_initial_states are returned whether or not the forward had a bias or
// initial states (the latter is then the gradient with respect to the zero
// states). The pre-activation is recomputed, not saved.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> causal_conv1d_backward(
    const at::Tensor& grad_output, const at::Tensor& x, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& initial_states,
    const std::optional<at::Tensor>& grad_final_states, std::optional<std::string_view> activation);

// One decoding step: x (batch, dim) or (batch, dim, seqlen) continues the
// sequence whose last inputs `conv_state` (batch, dim, state_len >= width-1)
// holds. Returns the outputs for x (x's shape; act(bias + the convolution
// over conv_state ++ x)) and shifts conv_state in place to the last
// state_len inputs of conv_state ++ x. For inference: not differentiable
// (an error under recorded autograd); x, weight and bias must not share
// memory with conv_state.
at::Tensor causal_conv1d_update(const at::Tensor& x, at::Tensor& conv_state,
                                const at::Tensor& weight,
                                const std::optional<at::Tensor>& bias = std::nullopt,
                                std::optional<std::string_view> activation = std::nullopt);

}  // namespace fuseops
