// fuseops::rope and rope_backward through the dispatcher, against an ATen
// composite of Hugging Face's formula (q * cos + rotate(q) * sin, with the
// cache rows gathered by position) evaluated in float64.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <fuseops/fuseops.h>

#include "test_helpers.h"

namespace {

using fuseops::testing::expect_error_mentions;
using fuseops::testing::kDtypes;

class Rope : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(Rope);

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

at::Tensor rotate_every_two(const at::Tensor& x) {
  auto pairs = x.unflatten(-1, {-1, 2});
  return at::stack({-pairs.select(-1, 1), pairs.select(-1, 0)}, -1).flatten(-2);
}

// float64 composite: x [..., H, D], cos/sin [max_pos, rd], positions [...].
at::Tensor reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& positions, bool interleaved) {
  const int64_t rd = cos.size(-1);
  const at::Tensor xd = x.to(at::kDouble);
  const at::Tensor c = cos.to(at::kDouble).index({positions}).unsqueeze(-2);
  const at::Tensor s = sin.to(at::kDouble).index({positions}).unsqueeze(-2);
  const at::Tensor rot = xd.narrow(-1, 0, rd);
  const at::Tensor turned = interleaved ? rotate_every_two(rot) : rotate_half(rot);
  return at::cat({rot * c + turned * s, xd.narrow(-1, rd, x.size(-1) - rd)}, -1);
}

// A cache in the layout Hugging Face builds: NeoX cat(freqs, freqs), GPT-J
// each frequency twice in a row.
std::pair<at::Tensor, at::Tensor> cache(int64_t max_pos, int64_t rd, bool interleaved,
                                        at::Device device = at::kCPU) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device);
  const at::Tensor inv = at::pow(10000.0, -at::arange(0, rd, 2, f64) / rd);
  const at::Tensor freqs = at::outer(at::arange(max_pos, f64), inv);
  const at::Tensor full =
      interleaved ? freqs.repeat_interleave(2, -1) : at::cat({freqs, freqs}, -1);
  return {full.cos().to(at::kFloat), full.sin().to(at::kFloat)};
}

double tolerance(at::ScalarType dtype) {
  // One rounding of a float32 (float64) sum of two products: a unit of the
  // dtype's last place (bfloat16 2^-8, float16 2^-11), doubled.
  switch (dtype) {
    case at::kBFloat16:
      return 1.0 / 128;
    case at::kHalf:
      return 1.0 / 1024;
    case at::kFloat:
      return 1e-6;
    default:
      return 1e-12;
  }
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, at::ScalarType dtype) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  const double tol = tolerance(dtype);
  const double err = (actual.to(at::kDouble) - expected).abs().max().item<double>();
  // Values are O(1) (|x| <= ~5, |cos|, |sin| <= 1): the tolerance is
  // relative to max(1, max|expected|).
  EXPECT_LE(err, tol * std::max(1.0, expected.abs().max().item<double>())) << dtype;
}

struct Case {
  std::vector<int64_t> lead;
  int64_t heads, kv_heads, head_dim, rotary_dim;
  bool interleaved;
};

const std::vector<Case> kCases = {
    {{7}, 4, 2, 64, 64, false},   {{7}, 4, 1, 64, 64, true},     {{2, 5}, 3, 3, 40, 24, false},
    {{2, 5}, 2, 1, 40, 24, true}, {{33}, 2, 2, 130, 130, false}, {{1}, 1, 1, 6, 2, true},
};

TEST_P(Rope, ForwardAndBackwardMatchTheComposite) {
  for (auto dtype : kDtypes) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(testing::Message()
                   << dtype << " heads " << c.heads << "/" << c.kv_heads << " d " << c.head_dim
                   << " rd " << c.rotary_dim << " interleaved " << c.interleaved);
      auto [cos, sin] = cache(100, c.rotary_dim, c.interleaved, device());
      std::vector<int64_t> q_shape = c.lead, k_shape = c.lead;
      q_shape.insert(q_shape.end(), {c.heads, c.head_dim});
      k_shape.insert(k_shape.end(), {c.kv_heads, c.head_dim});
      const at::Tensor positions = at::randint(0, 100, c.lead, options(at::kLong));
      const at::Tensor q = at::randn(q_shape, options()).to(dtype).requires_grad_();
      const at::Tensor k = at::randn(k_shape, options()).to(dtype).requires_grad_();
      auto [q_out, k_out] = fuseops::rope(q, k, cos, sin, positions, c.interleaved);
      expect_close(q_out, reference(q, cos, sin, positions, c.interleaved), dtype);
      expect_close(k_out, reference(k, cos, sin, positions, c.interleaved), dtype);

      // Gradients through the C++ autograd vs float64 autograd of the
      // composite.
      const at::Tensor gq = at::randn(q_shape, options()).to(dtype);
      const at::Tensor gk = at::randn(k_shape, options()).to(dtype);
      const auto grads = torch::autograd::grad({q_out, k_out}, {q, k}, {gq, gk});
      const at::Tensor qd = q.detach().to(at::kDouble).requires_grad_();
      const at::Tensor kd = k.detach().to(at::kDouble).requires_grad_();
      const auto want = torch::autograd::grad({reference(qd, cos, sin, positions, c.interleaved),
                                               reference(kd, cos, sin, positions, c.interleaved)},
                                              {qd, kd}, {gq.to(at::kDouble), gk.to(at::kDouble)});
      expect_close(grads[0], want[0], dtype);
      expect_close(grads[1], want[1], dtype);
      // The backward op called directly is the same transposed rotation.
      auto [bq, bk] = fuseops::rope_backward(gq, gk, cos, sin, positions, c.interleaved);
      expect_close(bq, want[0], dtype);
      expect_close(bk, want[1], dtype);
    }
  }
}

TEST_P(Rope, StridedViewsOfAFusedQkvAndInPlace) {
  // q and k as views of one [tokens, (H + 2 Hk) * D] projection output.
  const int64_t tokens = 9, heads = 4, kv = 2, d = 32;
  auto [cos, sin] = cache(64, d, false, device());
  const at::Tensor positions = at::arange(tokens, options(at::kLong)) * 3;
  const at::Tensor qkv = at::randn({tokens, (heads + 2 * kv) * d}, options());
  const at::Tensor q = qkv.narrow(1, 0, heads * d).view({tokens, heads, d});
  const at::Tensor k = qkv.narrow(1, heads * d, kv * d).view({tokens, kv, d});
  const at::Tensor v_before = qkv.narrow(1, (heads + kv) * d, kv * d).clone();
  const at::Tensor q_want = reference(q, cos, sin, positions, false);
  const at::Tensor k_want = reference(k, cos, sin, positions, false);
  auto [q_out, k_out] = fuseops::rope(q, k, cos, sin, positions);
  expect_close(q_out, q_want, at::kFloat);
  expect_close(k_out, k_want, at::kFloat);

  at::Tensor q_view = q, k_view = k;
  fuseops::rope_(q_view, k_view, cos, sin, positions);
  expect_close(q, q_want, at::kFloat);
  expect_close(k, k_want, at::kFloat);
  EXPECT_TRUE(at::equal(qkv.narrow(1, (heads + kv) * d, kv * d), v_before));
}

TEST(Rope, BadInputsNameTheOpAndArgument) {
  auto [cos, sin] = cache(16, 8, false);
  const at::Tensor q = at::randn({4, 2, 8});
  const at::Tensor k = at::randn({4, 1, 8});
  const at::Tensor positions = at::arange(4, at::kLong);
  expect_error_mentions([&] { fuseops::rope(q, k, cos, sin, positions + 13); },
                        {"fuseops::rope", "'positions'", "[0, 16)", "16"});
  expect_error_mentions([&] { fuseops::rope(q, k, cos, sin, positions - 1); },
                        {"fuseops::rope", "'positions'", "-1"});
  expect_error_mentions([&] { fuseops::rope(q, at::randn({3, 1, 8}), cos, sin, positions); },
                        {"fuseops::rope", "'key'", "[3, 1, 8]"});
  expect_error_mentions(
      [&] { fuseops::rope(q, k, cos.narrow(1, 0, 3), sin.narrow(1, 0, 3), positions); },
      {"fuseops::rope", "rotary dim", "even", "3"});
  expect_error_mentions([&] { fuseops::rope(q, k, cos, sin, positions.to(at::kFloat)); },
                        {"fuseops::rope", "'positions'", "int64", "Float"});
  // key_out inside out: refused (one result would overwrite the other).
  at::Tensor out = at::empty({4, 2, 8});
  at::Tensor inside = out.narrow(1, 0, 1);
  expect_error_mentions([&] { fuseops::rope_out(q, k, cos, sin, positions, false, out, inside); },
                        {"fuseops::rope.out", "'out'", "'key_out'", "share memory"});
}

}  // namespace
