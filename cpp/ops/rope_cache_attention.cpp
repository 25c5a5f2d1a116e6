// fuseops::rope_cache_attention: schema, C++ API, checks, and its kernels on
// every backend. A composite family (fuseops_add_op(... COMPOSITE)): one
// call runs fuseops::rope_out, whose kernel writes the rotated keys straight
// into their cache slots (no rotated copy of the keys, no index_copy), one
// copy of the values into theirs, and fuseops::decode_attention over the
// cache up to the last new token. What it saves a decode step is the work
// between those kernels: the rotary call, the cache's position arithmetic
// and two index_copy calls per layer, each a dispatch (and in eager Python
// a frame) of its own. Semantics: cpp/include/fuseops/rope_cache_attention.h.

#include <cmath>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <fuseops/decode_attention.h>
#include <fuseops/rope.h>
#include <fuseops/rope_cache_attention.h>

#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/output_memory.h"
#include "ops/common/tensors.h"

namespace fuseops {
namespace {

constexpr const char* kOp = "fuseops::rope_cache_attention";

void check_rank4(const char* arg, const at::Tensor& t, const char* layout) {
  check_defined(kOp, arg, t);
  TORCH_CHECK(t.dim() == 4, kOp, ": argument '", arg, "' must be 4-D ", layout, ", got shape ",
              t.sizes());
}

// `t` (a rank <= 4 tensor) broadcasts to `full`.
bool broadcasts_to(const at::Tensor& t, at::IntArrayRef full) {
  if (t.dim() > static_cast<int64_t>(full.size())) {
    return false;
  }
  const int64_t offset = static_cast<int64_t>(full.size()) - t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) != 1 && t.size(d) != full[offset + d]) {
      return false;
    }
  }
  return true;
}

struct Shapes {
  int64_t batch, q_heads, q_len, dim, kv_heads, v_dim, slots;
};

// Every check that needs no tensor's values (the Meta kernel's too).
Shapes check_all(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                 const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& key_cache,
                 const at::Tensor& value_cache, const at::Tensor& cache_length,
                 const at::Tensor& mask, std::optional<double> scale, double softcap) {
  check_rank4("query", query, "[batch, query_heads, new_tokens, head_dim]");
  check_rank4("key", key, "[batch, kv_heads, new_tokens, head_dim]");
  check_rank4("value", value, "[batch, kv_heads, new_tokens, value_dim]");
  check_rank4("key_cache", key_cache, "[batch, kv_heads, cache_slots, head_dim]");
  check_rank4("value_cache", value_cache, "[batch, kv_heads, cache_slots, value_dim]");
  check_floating_input(kOp, "query", query);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"key", key},
                                {"value", value},
                                {"key_cache", key_cache},
                                {"value_cache", value_cache}}) {
    check_same_dtype(kOp, name, t, "query", query);
    check_same_device(kOp, name, t, "query", query);
  }
  const Shapes s{query.size(0), query.size(1),       query.size(2),    query.size(3),
                 key.size(1),   value_cache.size(3), key_cache.size(2)};
  TORCH_CHECK(s.kv_heads > 0 && s.q_heads % s.kv_heads == 0, kOp, ": the query heads (", s.q_heads,
              ") must be a multiple of the key/value heads (", s.kv_heads, "); query shape ",
              query.sizes(), ", key shape ", key.sizes());
  const std::vector<int64_t> new_keys{s.batch, s.kv_heads, s.q_len, s.dim};
  TORCH_CHECK(key.sizes() == at::IntArrayRef(new_keys), kOp,
              ": argument 'key' must be [batch, kv_heads, new_tokens, head_dim] with query's "
              "batch, new tokens and head size, ",
              at::IntArrayRef(new_keys), ", got shape ", key.sizes());
  TORCH_CHECK(value.size(0) == s.batch && value.size(1) == s.kv_heads && value.size(2) == s.q_len,
              kOp, ": argument 'value' must be [", s.batch, ", ", s.kv_heads, ", ", s.q_len,
              ", value_dim], got shape ", value.sizes());
  TORCH_CHECK(
      key_cache.size(0) == s.batch && key_cache.size(1) == s.kv_heads && key_cache.size(3) == s.dim,
      kOp, ": argument 'key_cache' must be [", s.batch, ", ", s.kv_heads, ", cache_slots, ", s.dim,
      "], got shape ", key_cache.sizes());
  const std::vector<int64_t> value_slots{s.batch, s.kv_heads, s.slots, value.size(3)};
  TORCH_CHECK(value_cache.sizes() == at::IntArrayRef(value_slots), kOp,
              ": argument 'value_cache' must be ", at::IntArrayRef(value_slots),
              " (key_cache's slots, value's size), got shape ", value_cache.sizes());
  TORCH_CHECK(cache_length.defined() && cache_length.scalar_type() == at::kLong &&
                  cache_length.numel() == 1,
              kOp, ": argument 'cache_length' must be an int64 tensor of one element, got ",
              cache_length.defined() ? cache_length.toString() : std::string("undefined"),
              " of shape ", cache_length.defined() ? cache_length.sizes() : at::IntArrayRef());
  TORCH_CHECK(cache_length.device() == query.device() || cache_length.device().is_cpu(), kOp,
              ": argument 'cache_length' must be on the CPU or on query's device (", query.device(),
              "), got ", cache_length.device());
  for (const auto& [name, t] :
       {std::pair<const char*, const at::Tensor&>{"cos", cos}, {"sin", sin}}) {
    TORCH_CHECK(t.defined() && at::isFloatingType(t.scalar_type()), kOp, ": argument '", name,
                "' must be a floating tensor");
    check_same_device(kOp, name, t, "query", query);
    TORCH_CHECK(t.dim() >= 1 && t.size(-1) % 2 == 0 && t.size(-1) <= s.dim &&
                    broadcasts_to(t, {s.batch, s.q_len, t.size(-1)}),
                kOp, ": argument '", name,
                "' must be [batch, new_tokens, rotary_dim] or broadcastable to it, rotary_dim "
                "even and at most the head size ",
                s.dim, ", got shape ", t.sizes());
  }
  check_same_dtype(kOp, "sin", sin, "cos", cos);
  TORCH_CHECK(cos.sizes() == sin.sizes(), kOp,
              ": arguments 'cos' and 'sin' must have one shape, got ", cos.sizes(), " and ",
              sin.sizes());
  if (mask.defined()) {
    check_same_device(kOp, "attn_mask", mask, "query", query);
    TORCH_CHECK(mask.scalar_type() == at::kBool || at::isFloatingType(mask.scalar_type()), kOp,
                ": argument 'attn_mask' must be bool or floating, got ", mask.scalar_type());
    // A 0-d mask broadcasts to every key; otherwise its last dimension is
    // checked against the cache where the position is known.
    const int64_t mask_keys = mask.dim() > 0 ? mask.size(-1) : 1;
    TORCH_CHECK(broadcasts_to(mask, {s.batch, s.q_heads, s.q_len, mask_keys}), kOp,
                ": argument 'attn_mask' of shape ", mask.sizes(),
                " is not broadcastable to [batch, query_heads, new_tokens, keys] = [", s.batch,
                ", ", s.q_heads, ", ", s.q_len, ", keys]");
  }
  if (scale.has_value()) {
    TORCH_CHECK(std::isfinite(*scale), kOp, ": argument 'scale' must be finite, got ", *scale);
  }
  TORCH_CHECK(std::isfinite(softcap) && softcap >= 0, kOp,
              ": argument 'softcap' must be finite and >= 0 (0: no softcap), got ", softcap);
  // The cache is written while the inputs are read: each written tensor
  // must be disjoint from everything else.
  const std::vector<std::pair<const char*, const at::Tensor*>> written{
      {"key_cache", &key_cache}, {"value_cache", &value_cache}, {"cache_length", &cache_length}};
  const std::vector<std::pair<const char*, const at::Tensor*>> read{
      {"query", &query}, {"key", &key}, {"value", &value},
      {"cos", &cos},     {"sin", &sin}, {"attn_mask", &mask}};
  for (size_t w = 0; w < written.size(); ++w) {
    for (size_t o = w + 1; o < written.size(); ++o) {
      TORCH_CHECK(!share_memory(*written[w].second, *written[o].second), kOp, ": arguments '",
                  written[w].first, "' and '", written[o].first,
                  "' share memory; each is written and needs its own tensor");
    }
    for (const auto& [name, t] : read) {
      TORCH_CHECK(!t->defined() || !share_memory(*written[w].second, *t), kOp, ": argument '",
                  written[w].first, "' shares memory with '", name,
                  "', which the op reads while it writes the cache");
    }
  }
  return s;
}

// The CPU and CUDA kernel: fuseops and ATen ops on the caches' views.
at::Tensor rope_cache_attention_composite(const at::Tensor& query, const at::Tensor& key,
                                          const at::Tensor& value, const at::Tensor& cos,
                                          const at::Tensor& sin, at::Tensor& key_cache,
                                          at::Tensor& value_cache, at::Tensor& cache_length,
                                          const std::optional<at::Tensor>& attn_mask,
                                          std::optional<double> scale, double softcap,
                                          bool interleaved) {
  const at::Tensor mask = detail::undefined_if_none(attn_mask);
  const Shapes s = check_all(query, key, value, cos, sin, key_cache, value_cache, cache_length,
                             mask, scale, softcap);
  const int64_t position = cache_length.item<int64_t>();
  TORCH_CHECK(position >= 0 && position + s.q_len <= s.slots, kOp, ": the cache holds ", s.slots,
              " tokens: cache_length ", position, " plus ", s.q_len,
              " new tokens do not fit (argument 'cache_length' or 'key_cache')");
  const int64_t keys = position + s.q_len;
  at::Tensor visible_mask;
  if (mask.defined()) {
    const int64_t mask_keys = mask.dim() > 0 ? mask.size(-1) : 1;
    TORCH_CHECK(mask_keys == 1 || mask_keys == s.slots || mask_keys == keys, kOp,
                ": argument 'attn_mask' must cover the cache's slots (", s.slots,
                ") or the keys up to the last new token (", keys, "), got shape ", mask.sizes());
    visible_mask = mask_keys == s.slots && s.slots != keys ? mask.narrow(-1, 0, keys) : mask;
  }
  // [B, L, H, D] views, rope's layout (tokens, then heads); the rotated
  // query into its own tensor, the rotated keys into their cache slots.
  at::Tensor rotated_query =
      detail::empty_output({s.batch, s.q_len, s.q_heads, s.dim}, query.options());
  at::Tensor key_slots = key_cache.narrow(2, position, s.q_len).transpose(1, 2);
  fuseops::rope_out(query.transpose(1, 2), key.transpose(1, 2), cos, sin, std::nullopt, interleaved,
                    rotated_query, key_slots);
  value_cache.narrow(2, position, s.q_len).copy_(value);
  at::Tensor out = fuseops::decode_attention(
      rotated_query.transpose(1, 2), key_cache.narrow(2, 0, keys), value_cache.narrow(2, 0, keys),
      visible_mask.defined() ? std::optional<at::Tensor>(visible_mask) : std::nullopt,
      /*is_causal=*/true, scale, softcap);
  cache_length.add_(s.q_len);
  return out;
}

at::Tensor rope_cache_attention_meta(const at::Tensor& query, const at::Tensor& key,
                                     const at::Tensor& value, const at::Tensor& cos,
                                     const at::Tensor& sin, at::Tensor& key_cache,
                                     at::Tensor& value_cache, at::Tensor& cache_length,
                                     const std::optional<at::Tensor>& attn_mask,
                                     std::optional<double> scale, double softcap,
                                     bool interleaved) {
  const Shapes s = check_all(query, key, value, cos, sin, key_cache, value_cache, cache_length,
                             detail::undefined_if_none(attn_mask), scale, softcap);
  return detail::empty_output({s.batch, s.q_heads, s.q_len, s.v_dim}, query.options());
}

}  // namespace

at::Tensor rope_cache_attention(const at::Tensor& query, const at::Tensor& key,
                                const at::Tensor& value, const at::Tensor& cos,
                                const at::Tensor& sin, at::Tensor& key_cache,
                                at::Tensor& value_cache, at::Tensor& cache_length,
                                const std::optional<at::Tensor>& attn_mask,
                                std::optional<double> scale, double softcap, bool interleaved) {
  check_floating_input(kOp, "query", query);
  static auto handle = detail::find_op<decltype(rope_cache_attention)>(kOp);
  return handle.call(query, key, value, cos, sin, key_cache, value_cache, cache_length,
                     detail::none_if_undefined(attn_mask), scale, softcap, interleaved);
}

TORCH_LIBRARY_IMPL(fuseops, CompositeExplicitAutograd, m) {
  m.impl("rope_cache_attention", TORCH_FN(rope_cache_attention_composite));
}

TORCH_LIBRARY_IMPL(fuseops, Meta, m) {
  m.impl("rope_cache_attention", TORCH_FN(rope_cache_attention_meta));
}

}  // namespace fuseops
