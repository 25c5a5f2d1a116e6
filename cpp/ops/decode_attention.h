#pragma once
// decode_attention's contract between its shared entry point and its
// kernels (CPU, CUDA, Meta). Semantics: cpp/include/fuseops/decode_attention.h.

#include <optional>

#include <ATen/core/Tensor.h>

#include "ops_generated/decode_attention.h"

namespace fuseops::detail {

// out [B, Hq, L, Dv] contiguous; query [B, Hq, L, D], key [B, Hkv, S, D],
// value [B, Hkv, S, Dv] of out's dtype, each with stride 1 in its last
// dimension (other strides any); mask undefined, or bool or float32
// expanded to [B, Hq, L, S] (any strides, 0 where broadcast). B, Hq, L, S,
// Dv > 0; scale finite, softcap >= 0 (0: none).
using DecodeAttentionKernel = void (*)(const at::Tensor& out, const at::Tensor& query,
                                       const at::Tensor& key, const at::Tensor& value,
                                       const at::Tensor& mask, bool is_causal, double scale,
                                       double softcap);

at::Tensor decode_attention_with(const at::Tensor& query, const at::Tensor& key,
                                 const at::Tensor& value,
                                 const std::optional<at::Tensor>& attn_mask, bool is_causal,
                                 std::optional<double> scale, double softcap,
                                 DecodeAttentionKernel kernel);

template <typename Kernels>
struct DecodeAttentionRegistrations {
  static at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& key,
                                     const at::Tensor& value,
                                     const std::optional<at::Tensor>& attn_mask, bool is_causal,
                                     std::optional<double> scale, double softcap) {
    return decode_attention_with(query, key, value, attn_mask, is_causal, scale, softcap,
                                 Kernels::forward());
  }

  // The operators of cpp/ops/decode_attention.yaml's `ops:`, each with the function of
  // the same name.
  template <typename Library>
  static void register_all(Library& m) {
    register_decode_attention_kernels<DecodeAttentionRegistrations>(m);
  }
};

}  // namespace fuseops::detail
