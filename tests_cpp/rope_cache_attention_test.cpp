// fuseops::rope_cache_attention through the dispatcher, against the same
// steps composed of ATen ops in float64 (rotate_half rotary, the cache
// written at cache_length, attention over the keys up to each new token),
// in every CPU build this CPU runs: the result, the cache slots written,
// the slots left alone and the length advanced.

#include <cmath>
#include <optional>

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fuseops/fuseops.h>

#include "ops/cpu/dispatch.h"
#include "test_helpers.h"

namespace {

using fuseops::testing::expect_error_mentions;
using fuseops::testing::reduction_tolerance;

class RopeCacheAttention : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(RopeCacheAttention);

// rotate_half rotary of x [B, H, L, D] by cos, sin [B, L, R], in float64.
at::Tensor rotated(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t r = cos.size(-1);
  const at::Tensor xd = x.to(at::kDouble);
  const at::Tensor c = cos.to(at::kDouble).unsqueeze(1);
  const at::Tensor s = sin.to(at::kDouble).unsqueeze(1);
  const at::Tensor head = xd.narrow(-1, 0, r);
  const at::Tensor half = at::cat({-head.narrow(-1, r / 2, r / 2), head.narrow(-1, 0, r / 2)}, -1);
  return at::cat({head * c + half * s, xd.narrow(-1, r, x.size(-1) - r)}, -1);
}

// Attention of q [B, Hq, L, D] (float64) against k, v [B, Hkv, P + L, *]:
// query i sees keys j <= P + i and those the bool mask allows.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const std::optional<at::Tensor>& mask, double softcap) {
  const int64_t group = q.size(1) / k.size(1);
  const int64_t q_len = q.size(2);
  const int64_t keys = k.size(2);
  const at::Tensor kk = k.to(at::kDouble).repeat_interleave(group, 1);
  const at::Tensor vv = v.to(at::kDouble).repeat_interleave(group, 1);
  at::Tensor s = at::matmul(q, kk.transpose(-1, -2)) / std::sqrt(double(q.size(3)));
  if (softcap > 0) {
    s = softcap * at::tanh(s / softcap);
  }
  const at::Tensor i = at::arange(q_len, s.options().dtype(at::kLong)).unsqueeze(1);
  const at::Tensor j = at::arange(keys, s.options().dtype(at::kLong)).unsqueeze(0);
  at::Tensor visible = (j <= i + (keys - q_len)).expand(s.sizes());
  if (mask) {
    visible = visible & mask->narrow(-1, 0, keys).expand(s.sizes());
  }
  s = s.masked_fill(visible.logical_not(), -INFINITY);
  const at::Tensor p = at::softmax(s, -1).masked_fill(visible.logical_not(), 0);
  return at::matmul(p, vv).masked_fill(visible.any(-1, true).logical_not(), 0);
}

TEST_P(RopeCacheAttention, MatchesFloat64CompositeAndWritesTheCacheInEveryBuild) {
  struct Case {
    int64_t batch, q_heads, kv_heads, q_len, slots, position, dim, v_dim, rotary;
    bool masked;
    double softcap;
  };
  for (auto dtype : fuseops::testing::kDtypes) {
    for (const Case& c : std::vector<Case>{{1, 4, 1, 1, 16, 0, 8, 8, 8, false, 0},
                                           {2, 8, 2, 1, 300, 137, 64, 64, 64, true, 0},
                                           {1, 16, 4, 3, 1200, 1000, 64, 64, 32, false, 0},
                                           {2, 6, 3, 5, 40, 20, 18, 9, 10, true, 30}}) {
      const at::Tensor q = at::randn({c.batch, c.q_len, c.q_heads, c.dim}, options())
                               .to(dtype)
                               .transpose(1, 2);  // HF's layout: a view of the projection
      const at::Tensor k = at::randn({c.batch, c.kv_heads, c.q_len, c.dim}, options()).to(dtype);
      const at::Tensor v = at::randn({c.batch, c.kv_heads, c.q_len, c.v_dim}, options()).to(dtype);
      const at::Tensor angles = at::rand({c.batch, c.q_len, c.rotary / 2}, options()) * 6.0;
      const at::Tensor cos = at::cat({angles.cos(), angles.cos()}, -1).to(dtype);
      const at::Tensor sin = at::cat({angles.sin(), angles.sin()}, -1).to(dtype);
      const at::Tensor k_cache0 =
          at::randn({c.batch, c.kv_heads, c.slots, c.dim}, options()).to(dtype);
      const at::Tensor v_cache0 =
          at::randn({c.batch, c.kv_heads, c.slots, c.v_dim}, options()).to(dtype);
      std::optional<at::Tensor> mask;
      if (c.masked) {
        mask = at::rand({c.batch, 1, c.q_len, c.slots}, options()) > 0.3;
      }
      const int64_t keys = c.position + c.q_len;
      const at::Tensor k_rot = rotated(k, cos, sin);
      const at::Tensor want_k_cache = k_cache0.to(at::kDouble);
      want_k_cache.narrow(2, c.position, c.q_len).copy_(k_rot);
      const at::Tensor want_v_cache = v_cache0.clone();
      want_v_cache.narrow(2, c.position, c.q_len).copy_(v);
      // The attention reads the cache as stored (the rotated keys rounded
      // to its dtype).
      const at::Tensor stored_k = want_k_cache.to(dtype).narrow(2, 0, keys);
      const at::Tensor want = attention(rotated(q, cos, sin).to(dtype).to(at::kDouble), stored_k,
                                        want_v_cache.narrow(2, 0, keys), mask, c.softcap);
      for (auto capability : fuseops::cpu::runnable_capabilities()) {
        fuseops::cpu::ScopedCapabilityOverride forced(capability);
        SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype
                                        << " slots " << c.slots << " L " << c.q_len);
        at::Tensor k_cache = k_cache0.clone();
        at::Tensor v_cache = v_cache0.clone();
        at::Tensor length = at::full({}, c.position, options().dtype(at::kLong));
        const at::Tensor y = fuseops::rope_cache_attention(q, k, v, cos, sin, k_cache, v_cache,
                                                           length, mask, std::nullopt, c.softcap);
        ASSERT_EQ(y.scalar_type(), dtype);
        ASSERT_EQ(y.sizes(), at::IntArrayRef({c.batch, c.q_heads, c.q_len, c.v_dim}));
        EXPECT_EQ(length.item<int64_t>(), keys);
        // Values copied and untouched slots kept: bit for bit. Rotated keys:
        // one rounding of float32 (float64) products of magnitude ~1.
        EXPECT_TRUE(at::equal(v_cache, want_v_cache));
        EXPECT_TRUE(at::equal(k_cache.narrow(2, 0, c.position), k_cache0.narrow(2, 0, c.position)));
        EXPECT_TRUE(at::equal(k_cache.narrow(2, keys, c.slots - keys),
                              k_cache0.narrow(2, keys, c.slots - keys)));
        const double tol = reduction_tolerance(dtype);
        EXPECT_TRUE(at::allclose(k_cache.to(at::kDouble), want_k_cache, tol, tol));
        EXPECT_TRUE(at::allclose(y.to(at::kDouble), want, tol, tol))
            << (y.to(at::kDouble) - want).abs().max().item<double>();
      }
    }
  }
}

TEST(RopeCacheAttention, RefusesGradientsOverflowOverlapAndBadInputs) {
  const char* op = "fuseops::rope_cache_attention";
  const at::Tensor q = at::randn({1, 4, 1, 8});
  const at::Tensor k = at::randn({1, 2, 1, 8});
  const at::Tensor v = at::randn({1, 2, 1, 8});
  const at::Tensor cos = at::randn({1, 1, 8});
  const at::Tensor sin = at::randn({1, 1, 8});
  at::Tensor k_cache = at::zeros({1, 2, 4, 8});
  at::Tensor v_cache = at::zeros({1, 2, 4, 8});
  at::Tensor length = at::full({}, 4, at::kLong);
  expect_error_mentions(
      [&] { fuseops::rope_cache_attention(q, k, v, cos, sin, k_cache, v_cache, length); },
      {op, "do not fit", "cache_length"});
  EXPECT_EQ(length.item<int64_t>(), 4);  // refused before anything is written
  length.fill_(0);
  expect_error_mentions(
      [&] {
        fuseops::rope_cache_attention(q.clone().requires_grad_(), k, v, cos, sin, k_cache, v_cache,
                                      length);
      },
      {op, "inference op"});
  expect_error_mentions(
      [&] { fuseops::rope_cache_attention(q, k, v, cos, sin, k_cache, k_cache, length); },
      {op, "'key_cache'", "'value_cache'", "share memory"});
  at::Tensor aliased = k_cache.narrow(2, 0, 1);
  expect_error_mentions(
      [&] { fuseops::rope_cache_attention(q, aliased, v, cos, sin, k_cache, v_cache, length); },
      {op, "'key_cache'", "'key'"});
  at::Tensor int_length = at::zeros({}, at::kInt);
  expect_error_mentions(
      [&] { fuseops::rope_cache_attention(q, k, v, cos, sin, k_cache, v_cache, int_length); },
      {op, "'cache_length'", "int64"});
  expect_error_mentions(
      [&] {
        fuseops::rope_cache_attention(q, k, v, at::randn({1, 1, 10}), at::randn({1, 1, 10}),
                                      k_cache, v_cache, length);
      },
      {op, "'cos'", "rotary_dim"});
  at::Tensor wide_cache = at::zeros({1, 2, 4, 6});
  expect_error_mentions(
      [&] { fuseops::rope_cache_attention(q, k, v, cos, sin, k_cache, wide_cache, length); },
      {op, "'value_cache'"});
  expect_error_mentions(
      [&] {
        fuseops::rope_cache_attention(q, k, v, cos, sin, k_cache, v_cache, length,
                                      at::ones({1, 1, 1, 3}, at::kBool));
      },
      {op, "'attn_mask'"});
  EXPECT_EQ(length.item<int64_t>(), 0);
}

FUSEOPS_THREADS_CASE(rope_cache_attention) {
  // A cache of its own per call (the op writes it), from the shared x.
  const at::Tensor x = in.x.narrow(0, 0, 4).reshape({1, 2, 2, -1}).narrow(-1, 0, 16).contiguous();
  at::Tensor k_cache = at::cat({x, x, x}, 2).repeat({1, 1, 20, 1});
  at::Tensor v_cache = k_cache.clone();
  at::Tensor length = at::full({}, 50, at::kLong);
  const at::Tensor q = x.repeat({1, 2, 1, 1});
  const at::Tensor angles = x.select(1, 0).narrow(-1, 0, 8);
  const at::Tensor cos = at::cat({angles.cos(), angles.cos()}, -1);
  const at::Tensor sin = at::cat({angles.sin(), angles.sin()}, -1);
  return {fuseops::rope_cache_attention(q, x, x, cos, sin, k_cache, v_cache, length), k_cache};
}

}  // namespace
