#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

namespace fuseops {

// Attention of a few new query tokens against a key/value cache, the step
// of autoregressive decoding, with grouped-query heads read in place:
//
//   out[b, h, i] = sum_j p[b, h, i, j] * value[b, h / G, j],
//   p = softmax_j(s), s[b, h, i, j] = c(scale * query[b, h, i] . key[b, h / G, j])
//
// with G = Hq / Hkv query heads per key/value head (Hq a multiple of Hkv),
// c(s) = softcap * tanh(s / softcap) when softcap > 0 (Gemma 2) and s
// otherwise, and s[..., j] = -inf for the keys a row may not see.
//   query [B, Hq, L, D], key [B, Hkv, S, D], value [B, Hkv, S, Dv], one
//   floating dtype (float32, bfloat16, float16 or float64); any strides.
//   attn_mask, optional, broadcastable to [B, Hq, L, S]: bool (true = the
//     key may be seen) or floating (added to s after the softcap; -inf hides
//     the key whatever its score).
//   is_causal: the L queries are the last L positions of the S keys (a
//     query at position S - L + i sees keys j <= S - L + i), the alignment
//     of decoding with a cache; combined with attn_mask if both are given.
//   scale: default 1 / sqrt(D).
// Returns [B, Hq, L, Dv] (contiguous, query's dtype). Scores, softmax and
// the weighted sum are computed in float32 (float64 for float64 inputs),
// each key and value row read once per group of G heads. A row that may see
// no key at all returns zeros (torch's scaled_dot_product_attention returns
// NaN there). NaN in a seen score makes its row NaN. Inference op: no
// derivative; called on tensors that require grad with grad mode on it
// raises.
at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const std::optional<at::Tensor>& attn_mask = std::nullopt,
                            bool is_causal = false, std::optional<double> scale = std::nullopt,
                            double softcap = 0.0);

}  // namespace fuseops
