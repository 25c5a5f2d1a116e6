// fuseops::decode_attention through the dispatcher, against attention
// composed of ATen ops in float64 (key/value heads repeated for their query
// heads, the mask, causal limit and softcap applied to the scores), in every
// CPU build this CPU runs.

#include <cmath>
#include <limits>
#include <optional>

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fuseops/fuseops.h>

#include "ops/cpu/dispatch.h"
#include "test_helpers.h"

namespace {

using fuseops::testing::expect_error_mentions;
using fuseops::testing::reduction_tolerance;

class DecodeAttention : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(DecodeAttention);

at::Tensor reference(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                     const std::optional<at::Tensor>& mask, bool is_causal, double softcap) {
  const int64_t group = query.size(1) / key.size(1);
  const int64_t q_len = query.size(2);
  const int64_t keys = key.size(2);
  const at::Tensor q = query.to(at::kDouble);
  const at::Tensor k = key.to(at::kDouble).repeat_interleave(group, 1);
  const at::Tensor v = value.to(at::kDouble).repeat_interleave(group, 1);
  at::Tensor s = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(query.size(3)));
  if (softcap > 0) {
    s = softcap * at::tanh(s / softcap);
  }
  at::Tensor visible = at::ones_like(s, s.options().dtype(at::kBool));
  if (is_causal) {
    const at::Tensor i = at::arange(q_len, s.options().dtype(at::kLong)).unsqueeze(1);
    const at::Tensor j = at::arange(keys, s.options().dtype(at::kLong)).unsqueeze(0);
    visible = visible & (j <= i + (keys - q_len));
  }
  if (mask) {
    visible = visible & mask->expand(s.sizes());
  }
  s = s.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
  const at::Tensor p = at::softmax(s, -1).masked_fill(visible.logical_not(), 0);
  const at::Tensor out = at::matmul(p, v);
  // Rows that see no key: zeros.
  return out.masked_fill(visible.any(-1, true).logical_not(), 0);
}

TEST_P(DecodeAttention, MatchesFloat64CompositeInEveryBuild) {
  struct Case {
    int64_t batch, q_heads, kv_heads, q_len, keys, dim, v_dim;
    bool causal, masked;
    double softcap;
  };
  for (auto dtype : fuseops::testing::kDtypes) {
    for (const Case& c : std::vector<Case>{{1, 4, 1, 1, 7, 8, 8, false, false, 0},
                                           {2, 8, 2, 1, 300, 64, 64, false, true, 0},
                                           {1, 16, 4, 1, 1500, 64, 64, false, false, 0},
                                           {2, 6, 3, 5, 40, 17, 9, true, false, 50},
                                           {1, 2, 2, 37, 37, 16, 16, true, true, 0},
                                           {1, 2, 1, 4, 2, 8, 8, true, false, 0}}) {
      const at::Tensor q = at::randn({c.batch, c.q_heads, c.q_len, c.dim}, options()).to(dtype);
      const at::Tensor k = at::randn({c.batch, c.kv_heads, c.keys, c.dim}, options()).to(dtype);
      const at::Tensor v = at::randn({c.batch, c.kv_heads, c.keys, c.v_dim}, options()).to(dtype);
      std::optional<at::Tensor> mask;
      if (c.masked) {
        mask = at::rand({c.batch, 1, c.q_len, c.keys}, options()) > 0.3;
      }
      const at::Tensor want = reference(q, k, v, mask, c.causal, c.softcap);
      for (auto capability : fuseops::cpu::runnable_capabilities()) {
        fuseops::cpu::ScopedCapabilityOverride forced(capability);
        SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype
                                        << " keys " << c.keys << " L " << c.q_len);
        const at::Tensor y =
            fuseops::decode_attention(q, k, v, mask, c.causal, std::nullopt, c.softcap);
        ASSERT_EQ(y.scalar_type(), dtype);
        ASSERT_EQ(y.sizes(), want.sizes());
        // Softmax-weighted means of values of magnitude ~1: the float32
        // (or bfloat16/float16 output) rounding of a reduction.
        const double tol = reduction_tolerance(dtype);
        EXPECT_TRUE(at::allclose(y.to(at::kDouble), want, tol, tol))
            << (y.to(at::kDouble) - want).abs().max().item<double>();
      }
    }
  }
}

TEST_P(DecodeAttention, RowsThatSeeNoKeyAreZeroAndFloatMasksAdd) {
  const at::Tensor q = at::randn({1, 2, 3, 8}, options());
  const at::Tensor k = at::randn({1, 1, 4, 8}, options());
  const at::Tensor v = at::randn({1, 1, 4, 8}, options());
  at::Tensor mask = at::zeros({1, 1, 3, 4}, options());
  mask.select(2, 0).fill_(-std::numeric_limits<double>::infinity());
  mask.select(2, 1).narrow(-1, 0, 2).fill_(-std::numeric_limits<double>::infinity());
  mask.select(2, 2).fill_(0.5);
  const at::Tensor y = fuseops::decode_attention(q, k, v, mask);
  EXPECT_TRUE(at::equal(y.select(2, 0), at::zeros({1, 2, 8}, options())));
  const at::Tensor bool_mask = mask != -std::numeric_limits<double>::infinity();
  const at::Tensor want = reference(q, k, v, bool_mask, false, 0);
  // A constant added to every seen score of a row cancels in the softmax.
  EXPECT_TRUE(at::allclose(y.to(at::kDouble), want, 1e-5, 1e-5));
}

TEST(DecodeAttention, RefusesGradientsAndBadInputs) {
  const char* op = "fuseops::decode_attention";
  const at::Tensor q = at::randn({1, 4, 1, 8});
  const at::Tensor k = at::randn({1, 2, 5, 8});
  const at::Tensor v = at::randn({1, 2, 5, 8});
  expect_error_mentions([&] { fuseops::decode_attention(q.clone().requires_grad_(), k, v); },
                        {op, "inference op"});
  expect_error_mentions([&] { fuseops::decode_attention(q, at::randn({1, 3, 5, 8}), v); },
                        {op, "multiple of the key/value heads"});
  expect_error_mentions([&] { fuseops::decode_attention(q, k, at::randn({1, 2, 4, 8})); },
                        {op, "'value'"});
  expect_error_mentions([&] { fuseops::decode_attention(q, k.to(at::kDouble), v); },
                        {op, "'key'", "dtype"});
  expect_error_mentions([&] { fuseops::decode_attention(q.select(0, 0), k, v); },
                        {op, "'query'", "4-D"});
  expect_error_mentions([&] { fuseops::decode_attention(q, k, v, at::ones({2, 5})); },
                        {op, "'attn_mask'", "broadcastable"});
  expect_error_mentions([&] { fuseops::decode_attention(q, k, v, at::ones({1, 5}, at::kInt)); },
                        {op, "'attn_mask'", "bool or floating"});
  expect_error_mentions(
      [&] { fuseops::decode_attention(q, k, v, std::nullopt, false, std::nullopt, -1.0); },
      {op, "'softcap'"});
}

}  // namespace
