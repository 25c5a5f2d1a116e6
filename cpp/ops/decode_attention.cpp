// fuseops::decode_attention: the C++ API, the shared checks and the `*_with`
// entry points that every backend's kernels go through. The schemas and the
// Meta, CPU and CUDA registrations are generated from
// cpp/ops/decode_attention.yaml. CPU kernels:
// cpp/ops/cpu/decode_attention_kernel.cpp; CUDA:
// cuda/decode_attention_kernel.cu; autograd: none (`autograd:` in
// cpp/ops/decode_attention.yaml declares its refusals).

#include "ops/decode_attention.h"

#include <cmath>

#include <torch/library.h>

#include <fuseops/decode_attention.h>

#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/output_memory.h"
#include "ops/common/tensors.h"

namespace fuseops {
namespace detail {
namespace {

constexpr const char* kOp = "fuseops::decode_attention";

void check_rank4(const char* arg, const at::Tensor& t, const char* layout) {
  TORCH_CHECK(t.dim() == 4, kOp, ": argument '", arg, "' must be 4-D ", layout, ", got shape ",
              t.sizes());
}

// The kernel reads rows with stride 1 along the last dimension; any other
// stride is taken as it is (a cache slice, a transposed query).
at::Tensor unit_last_stride(const at::Tensor& t) {
  return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous();
}

// attn_mask broadcast to [B, Hq, L, S]: bool kept, floating as float32.
at::Tensor expanded_mask(const at::Tensor& mask, at::IntArrayRef full, bool convert) {
  TORCH_CHECK(mask.scalar_type() == at::kBool || at::isFloatingType(mask.scalar_type()), kOp,
              ": argument 'attn_mask' must be bool or floating, got ", mask.scalar_type());
  TORCH_CHECK(mask.dim() <= 4, kOp,
              ": argument 'attn_mask' must have at most 4 dimensions (broadcastable to [B, Hq, "
              "L, S] = ",
              full, "), got shape ", mask.sizes());
  const int64_t offset = 4 - mask.dim();
  for (int64_t d = 0; d < mask.dim(); ++d) {
    TORCH_CHECK(mask.size(d) == 1 || mask.size(d) == full[offset + d], kOp,
                ": argument 'attn_mask' of shape ", mask.sizes(),
                " is not broadcastable to [B, Hq, L, S] = ", full);
  }
  if (!convert) {
    return mask;
  }
  const at::Tensor m = mask.scalar_type() == at::kBool ? mask : mask.to(at::kFloat);
  return m.expand(full);
}

}  // namespace

at::Tensor decode_attention_with(const at::Tensor& query, const at::Tensor& key,
                                 const at::Tensor& value,
                                 const std::optional<at::Tensor>& attn_mask, bool is_causal,
                                 std::optional<double> scale, double softcap,
                                 DecodeAttentionKernel kernel) {
  check_floating_input(kOp, "query", query);
  check_floating_input(kOp, "key", key);
  check_floating_input(kOp, "value", value);
  check_rank4("query", query, "[batch, query_heads, query_len, head_dim]");
  check_rank4("key", key, "[batch, kv_heads, kv_len, head_dim]");
  check_rank4("value", value, "[batch, kv_heads, kv_len, value_dim]");
  check_same_dtype(kOp, "key", key, "query", query);
  check_same_dtype(kOp, "value", value, "query", query);
  check_same_device(kOp, "key", key, "query", query);
  check_same_device(kOp, "value", value, "query", query);
  const int64_t batch = query.size(0);
  const int64_t q_heads = query.size(1);
  const int64_t q_len = query.size(2);
  const int64_t dim = query.size(3);
  const int64_t kv_heads = key.size(1);
  const int64_t keys = key.size(2);
  TORCH_CHECK(key.size(0) == batch && value.size(0) == batch, kOp,
              ": arguments 'key' and 'value' must have the batch size of 'query' (", batch,
              "), got shapes ", key.sizes(), " and ", value.sizes());
  TORCH_CHECK(kv_heads > 0, kOp, ": argument 'key' must have at least one head, got shape ",
              key.sizes());
  TORCH_CHECK(q_heads % kv_heads == 0, kOp, ": the query heads (", q_heads,
              ") must be a multiple of the key/value heads (", kv_heads, "); query shape ",
              query.sizes(), ", key shape ", key.sizes());
  TORCH_CHECK(value.size(1) == kv_heads && value.size(2) == keys, kOp,
              ": argument 'value' must have the heads and length of 'key' (", kv_heads, ", ", keys,
              "), got shape ", value.sizes());
  TORCH_CHECK(key.size(3) == dim, kOp, ": argument 'key' must have the head size of 'query' (", dim,
              "), got shape ", key.sizes());
  if (scale.has_value()) {
    TORCH_CHECK(std::isfinite(*scale), kOp, ": argument 'scale' must be finite, got ", *scale);
  }
  TORCH_CHECK(std::isfinite(softcap) && softcap >= 0, kOp,
              ": argument 'softcap' must be finite and >= 0 (0: no softcap), got ", softcap);
  const std::vector<int64_t> full{batch, q_heads, q_len, keys};
  at::Tensor mask;
  if (attn_mask.has_value() && attn_mask->defined()) {
    check_same_device(kOp, "attn_mask", *attn_mask, "query", query);
    mask = expanded_mask(*attn_mask, full, kernel != nullptr);
  }
  at::Tensor out = empty_output({batch, q_heads, q_len, value.size(3)}, query.options());
  if (kernel == nullptr || out.numel() == 0) {
    return out;
  }
  if (keys == 0) {
    return out.zero_();  // no row sees a key
  }
  const double used_scale = scale.value_or(dim > 0 ? 1.0 / std::sqrt(double(dim)) : 1.0);
  kernel(out, unit_last_stride(query), unit_last_stride(key), unit_last_stride(value), mask,
         is_causal, used_scale, softcap);
  return out;
}

}  // namespace detail

at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const std::optional<at::Tensor>& attn_mask, bool is_causal,
                            std::optional<double> scale, double softcap) {
  check_floating_input(detail::kOp, "query", query);
  check_floating_input(detail::kOp, "key", key);
  check_floating_input(detail::kOp, "value", value);
  static auto handle = detail::find_op<decltype(decode_attention)>(detail::kOp);
  return handle.call(query, key, value, detail::none_if_undefined(attn_mask), is_causal, scale,
                     softcap);
}

}  // namespace fuseops
