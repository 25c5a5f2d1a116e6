#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

namespace fuseops {

// One decode step of a self-attention layer against a static key/value
// cache, in one call: the rotary embedding of the new tokens' query and
// key, the key and value written into the cache, and the attention of the
// rotated query against every cached token up to its own position:
//
//   p = cache_length (read once), L new tokens at positions p .. p + L - 1;
//   k_rot, q_rot = rope(key, cos, sin), rope(query, cos, sin);
//   key_cache[:, :, p + i] = k_rot[:, :, i];  value_cache[:, :, p + i] = value[:, :, i];
//   out = decode_attention(q_rot, key_cache[:, :, :p + L], value_cache[:, :, :p + L],
//                          attn_mask[..., :p + L], is_causal=true, scale, softcap);
//   cache_length += L.
//
// So query i sees the cached keys j <= p + i (and, with attn_mask, only
// those the mask allows: padding, a sliding window); the cache's slots past
// p + L are never read (a static cache holds zeros or garbage there).
//   query [B, Hq, L, D], key [B, Hkv, L, D], value [B, Hkv, L, Dv]: one
//     floating dtype, any strides (views of one projection included).
//   cos, sin: per token, [B, L, R] or broadcastable to it ([L, R], [1, L,
//     R]), R (the rotary dim) even and at most D, any floating dtype:
//     Hugging Face's position_embeddings. interleaved selects GPT-J pairs
//     (2j, 2j + 1) instead of rotate_half's (j, j + R / 2), as fuseops::rope.
//   key_cache [B, Hkv, S, D], value_cache [B, Hkv, S, Dv]: query's dtype
//     and device, written in place; they must not overlap each other or any
//     input.
//   cache_length: int64 with one element (Hugging Face's StaticLayer
//     cumulative_length), on any device; advanced by L in place. p + L must
//     be at most S.
//   attn_mask, optional: bool or floating, broadcastable to [B, Hq, L, S]
//     (Hugging Face's static-cache mask) or to [B, Hq, L, p + L].
// Returns [B, Hq, L, Dv] (contiguous, query's dtype). The rotation is
// computed in float32 (float64 for float64) and rounded once to the
// cache's dtype, as fuseops::rope; the attention is fuseops::decode_attention's
// (its precision and rules: a row that sees no key gives zeros). Inference
// op: no derivative; a call that would record a gradient raises. On CUDA,
// reading cache_length is one device-to-host copy.
at::Tensor rope_cache_attention(const at::Tensor& query, const at::Tensor& key,
                                const at::Tensor& value, const at::Tensor& cos,
                                const at::Tensor& sin, at::Tensor& key_cache,
                                at::Tensor& value_cache, at::Tensor& cache_length,
                                const std::optional<at::Tensor>& attn_mask = std::nullopt,
                                std::optional<double> scale = std::nullopt, double softcap = 0.0,
                                bool interleaved = false);

}  // namespace fuseops
