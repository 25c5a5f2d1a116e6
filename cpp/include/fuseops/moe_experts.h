#pragma once
// The routed experts of a mixture-of-experts layer in one op: each token's
// top-k experts (a gated MLP each), weighted by the router and summed, in
// the weight layout of transformers' experts classes.
//
//   out[t] = sum_k weights[t, k] * down[e] @ (act(gate[e] @ x[t]) * (up[e] @ x[t])),
//   e = index[t, k], gate[e] = gate_up_proj[e, :I], up[e] = gate_up_proj[e, I:].
//
// hidden [T, H]; top_k_index [T, K] (int64 or int32, each in [0, E));
// top_k_weights [T, K] (any floating dtype); gate_up_proj [E, 2*I, H] (the
// gate rows first), down_proj [E, H, I], both of hidden's dtype, any
// strides. activation: "silu", "gelu" or "gelu_tanh". bfloat16/float16
// inputs compute in float32 (products, activation, the weighted sum) and
// round the result once; only an expert given fewer than kLinearWidenedRows
// rows (decoding) runs its forward products through linear's streaming
// kernel, rounded to the dtype.

#include <optional>
#include <string_view>
#include <tuple>

#include <ATen/core/Tensor.h>

namespace fuseops {

// [T, H] in hidden's dtype. Differentiable in hidden, top_k_weights and both
// weights (C++ autograd).
at::Tensor moe_experts(const at::Tensor& hidden, const at::Tensor& top_k_index,
                       const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj,
                       const at::Tensor& down_proj, std::string_view activation = "silu");

// moe_experts and gate_up_out [T * K, 2I]: every (token, k) pair's first
// product (gate_up_proj[e] @ hidden[t]) in the compute dtype (float32 for
// bfloat16/float16), its rows in the kernels' order (the pairs sorted by
// expert, stably), for moe_experts_backward. Not differentiable.
std::tuple<at::Tensor, at::Tensor> moe_experts_forward(const at::Tensor& hidden,
                                                       const at::Tensor& top_k_index,
                                                       const at::Tensor& top_k_weights,
                                                       const at::Tensor& gate_up_proj,
                                                       const at::Tensor& down_proj,
                                                       std::string_view activation = "silu");

// (grad_hidden [T, H], grad_top_k_weights [T, K], grad_gate_up_proj [E, 2I, H],
// grad_down_proj [E, H, I]); with expert_grads false the last two are empty
// ([0]) and not computed (frozen experts). gate_up_out (moe_experts_forward's
// second result) saves the backward one product; without it the first
// product is recomputed. Not differentiable.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_experts_backward(
    const at::Tensor& grad_output, const at::Tensor& hidden, const at::Tensor& top_k_index,
    const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj, const at::Tensor& down_proj,
    std::string_view activation = "silu", bool expert_grads = true,
    const std::optional<at::Tensor>& gate_up_out = std::nullopt);

}  // namespace fuseops
