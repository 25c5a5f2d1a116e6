#pragma once

#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>

namespace fuseops {

// Rotary position embedding (RoPE) of query and key, as Hugging Face's
// apply_rotary_pos_emb computes it:
//   out[..., :rd] = x[..., :rd] * cos + rotate(x[..., :rd]) * sin
//   out[..., rd:] = x[..., rd:]                       (partial rotary)
// where rd = cos.size(-1) (the rotary dim: even, at most head_dim) and
//   rotate = rotate_half (NeoX/Llama, interleaved=false): pairs (j, j+rd/2),
//            rotate_half(x) = cat(-x[rd/2:], x[:rd/2]);
//   rotate = rotate_every_two (GPT-J, interleaved=true): pairs (2j, 2j+1),
//            rotate(x)[2j] = -x[2j+1], rotate(x)[2j+1] = x[2j].
// query is [..., heads, head_dim], key [..., kv_heads, head_dim] with the
// same leading (token) dimensions and head_dim (any number of heads; only
// the last dimension needs stride 1 to be read in place, views of one fused
// qkv tensor included).
//
// cos and sin are [max_pos, rd] caches in the layout Hugging Face models
// build (NeoX: cat(freqs, freqs); GPT-J: each frequency twice in a row,
// repeat_interleave(freqs, 2)) -- python's fuseops.rope_cache builds them --
// and `positions` (int32/int64, [tokens] or any shape broadcastable to the
// leading dimensions of query, e.g. [batch, seq] or [1, seq]) picks each
// token's row; a position outside [0, max_pos) is an error. Without
// positions, cos and sin are already per token: [..., rd], broadcastable to
// the leading dimensions of query (Hugging Face's position_embeddings
// [batch, seq, head_dim]). cos/sin may have any floating dtype; the rotation
// is computed in float32 (float64 for float64 query) and rounded once.
//
// Differentiable in query and key (C++ autograd; the backward is the
// transposed rotation, itself differentiable); cos and sin are not
// differentiable: a call that would record a gradient for them is an error.
// Results are contiguous.
std::tuple<at::Tensor, at::Tensor> rope(const at::Tensor& query, const at::Tensor& key,
                                        const at::Tensor& cos, const at::Tensor& sin,
                                        const std::optional<at::Tensor>& positions = std::nullopt,
                                        bool interleaved = false);

// rope of one tensor (a query without key, or a key alone).
at::Tensor rope_single(const at::Tensor& input, const at::Tensor& cos, const at::Tensor& sin,
                       const std::optional<at::Tensor>& positions = std::nullopt,
                       bool interleaved = false);

// rope into preallocated `out` and `key_out` (resized to the inputs' shapes
// if they differ). They may be `query` and `key` themselves, in place, also
// when those are strided views (e.g. of one fused qkv tensor); `out` and
// `key_out` must not share memory with each other. Not differentiable.
std::tuple<at::Tensor&, at::Tensor&> rope_out(const at::Tensor& query, const at::Tensor& key,
                                              const at::Tensor& cos, const at::Tensor& sin,
                                              const std::optional<at::Tensor>& positions,
                                              bool interleaved, at::Tensor& out,
                                              at::Tensor& key_out);

at::Tensor& rope_single_out(const at::Tensor& input, const at::Tensor& cos, const at::Tensor& sin,
                            const std::optional<at::Tensor>& positions, bool interleaved,
                            at::Tensor& out);

// In place (inference): rope_out(query, key, ..., query, key).
std::tuple<at::Tensor&, at::Tensor&> rope_(
    at::Tensor& query, at::Tensor& key, const at::Tensor& cos, const at::Tensor& sin,
    const std::optional<at::Tensor>& positions = std::nullopt, bool interleaved = false);

// Gradients of rope w.r.t. query and key: the transposed rotation
//   grad_x = g * cos + rotate^T(g * sin)
// (for the usual caches, the rotation by -theta). Differentiable (its
// derivative is rope itself).
std::tuple<at::Tensor, at::Tensor> rope_backward(
    const at::Tensor& grad_query, const at::Tensor& grad_key, const at::Tensor& cos,
    const at::Tensor& sin, const std::optional<at::Tensor>& positions = std::nullopt,
    bool interleaved = false);

at::Tensor rope_single_backward(const at::Tensor& grad_input, const at::Tensor& cos,
                                const at::Tensor& sin,
                                const std::optional<at::Tensor>& positions = std::nullopt,
                                bool interleaved = false);

// rope_backward into preallocated `out` and `key_out`, which may be
// `grad_query` and `grad_key` themselves (in place, as rope's autograd does
// with gradients nothing else refers to); as rope_out otherwise.
std::tuple<at::Tensor&, at::Tensor&> rope_backward_out(const at::Tensor& grad_query,
                                                       const at::Tensor& grad_key,
                                                       const at::Tensor& cos, const at::Tensor& sin,
                                                       const std::optional<at::Tensor>& positions,
                                                       bool interleaved, at::Tensor& out,
                                                       at::Tensor& key_out);

at::Tensor& rope_backward_single_out(const at::Tensor& grad_input, const at::Tensor& cos,
                                     const at::Tensor& sin,
                                     const std::optional<at::Tensor>& positions, bool interleaved,
                                     at::Tensor& out);

}  // namespace fuseops
