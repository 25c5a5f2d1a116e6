// fuseops int4 linear ops through the dispatcher, against ATen composites:
// quantize_per_group_int4 against its rule, the packed layout against its
// definition, int4_weight_only_linear against x @ w.T + bias in float64
// with w dequantized exactly, and the same bits from every CPU build this
// CPU runs.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fuseops/fuseops.h>

#include "ops/cpu/dispatch.h"
#include "test_helpers.h"

namespace {

using fuseops::testing::expect_error_mentions;
using fuseops::testing::linear_tolerance;

class Int4Linear : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(Int4Linear);

// (wq - zero) * scale per group, [N, K], in float64.
at::Tensor dequantize(const at::Tensor& wq, const at::Tensor& scale, const at::Tensor& zero,
                      int64_t group_size) {
  const int64_t k = wq.size(1);
  const at::Tensor index = at::arange(k, wq.options().dtype(at::kLong)).div(group_size, "floor");
  return (wq.to(at::kDouble) - zero.to(at::kDouble).index_select(1, index)) *
         scale.to(at::kDouble).index_select(1, index);
}

TEST_P(Int4Linear, QuantizeFollowsItsRule) {
  const at::Tensor w = at::randn({5, 70}, options());
  for (bool symmetric : {true, false}) {
    const auto [wq, scale, zero] = fuseops::quantize_per_group_int4(w, 32, symmetric);
    ASSERT_EQ(wq.scalar_type(), at::kByte);
    ASSERT_EQ(scale.sizes(), at::IntArrayRef({5, 3}));
    ASSERT_LE(wq.max().item<int64_t>(), 15);
    const at::Tensor back = dequantize(wq, scale, zero, 32);
    // Round to nearest: every value within half a step of its group, but
    // for the symmetric rule's values near -m, which round to 8 and are
    // clamped to 7 (a step at most).
    const at::Tensor step = scale.abs().to(at::kDouble).repeat_interleave(32, 1).narrow(1, 0, 70);
    const double steps = symmetric ? 1.0 : 0.5;
    EXPECT_TRUE(((back - w.to(at::kDouble)).abs() <= step * (steps + 1e-6)).all().item<bool>());
    if (symmetric) {
      EXPECT_TRUE((zero == 8).all().item<bool>());
      // The largest magnitude of each group comes back exactly, as -8 steps.
      for (int64_t g = 0; g < 3; ++g) {
        const at::Tensor part = w.narrow(1, 32 * g, std::min<int64_t>(32, 70 - 32 * g));
        const at::Tensor got = back.narrow(1, 32 * g, part.size(1));
        const at::Tensor idx = part.abs().argmax(1, true);
        EXPECT_TRUE(at::equal(got.gather(1, idx), part.to(at::kDouble).gather(1, idx)));
      }
    }
  }
}

TEST_P(Int4Linear, PackedLayoutFollowsItsDefinition) {
  const at::Tensor wq = at::randint(0, 16, {37, 10}, options().dtype(at::kByte));
  const at::Tensor scale = at::rand({37, 3}, options());
  const at::Tensor zero = at::randint(0, 16, {37, 3}, options().dtype(at::kByte));
  const auto [packed, scale_zero] = fuseops::pack_int4_weight(wq, scale, zero, 4);
  ASSERT_EQ(packed.sizes(), at::IntArrayRef({3, 6, 16}));
  ASSERT_EQ(scale_zero.sizes(), at::IntArrayRef({3, 2, 37}));
  const at::Tensor p = packed.cpu();
  const at::Tensor q = wq.cpu();
  for (int64_t n = 0; n < 48; ++n) {
    for (int64_t k = 0; k < 12; ++k) {
      const int64_t want = n < 37 && k < 10 ? q[n][k].item<int64_t>() : 0;
      const int64_t byte = p[n / 16][k / 2][n % 16].item<int64_t>();
      ASSERT_EQ(k % 2 == 0 ? byte & 0xF : byte >> 4, want) << n << " " << k;
    }
  }
  EXPECT_TRUE(at::equal(scale_zero.select(1, 0), scale.t()));
  EXPECT_TRUE(at::equal(scale_zero.select(1, 1), zero.t().to(at::kFloat)));
}

TEST_P(Int4Linear, MatchesCompositeAndIsIdenticalInEveryBuild) {
  for (auto dtype : fuseops::testing::kDtypes) {
    for (const auto& [m, n, k, group_size] :
         std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
             {1, 16, 32, 32}, {3, 37, 10, 4}, {7, 40, 129, 64}, {61, 33, 256, 128}, {2, 1, 1, 2}}) {
      const at::Tensor w = at::randn({n, k}, options());
      const auto [wq, scale, zero] = fuseops::quantize_per_group_int4(w, group_size, m % 2 == 1);
      const auto [packed, scale_zero] = fuseops::pack_int4_weight(wq, scale, zero, group_size);
      const at::Tensor x = at::randn({m, k}, options()).to(dtype);
      const at::Tensor bias = at::randn({n}, options()).to(dtype);
      const at::Tensor want =
          at::matmul(x.to(at::kDouble), dequantize(wq, scale, zero, group_size).t()) +
          bias.to(at::kDouble);
      std::optional<at::Tensor> first;
      for (auto capability : fuseops::cpu::runnable_capabilities()) {
        fuseops::cpu::ScopedCapabilityOverride forced(capability);
        SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype
                                        << " m " << m << " n " << n << " k " << k);
        const at::Tensor y =
            fuseops::int4_weight_only_linear(x, packed, scale_zero, group_size, bias);
        ASSERT_EQ(y.scalar_type(), dtype);
        ASSERT_EQ(y.sizes(), at::IntArrayRef({m, n}));
        const double scale_of_y = std::max(1.0, want.abs().max().item<double>());
        EXPECT_TRUE(at::allclose(y.to(at::kDouble), want, linear_tolerance(dtype),
                                 linear_tolerance(dtype) * scale_of_y))
            << (y.to(at::kDouble) - want).abs().max().item<double>();
        if (first) {
          EXPECT_TRUE(at::equal(y, *first));
        } else {
          first = y;
        }
      }
    }
  }
}

// W4A8: the same packed weights; the activations quantized per row and
// weight group (each group of a row as a row of quantize_per_token_int8, zeros
// past K), so the composite is, group by group, that op's result times the
// dequantized weight, in float64.
TEST_P(Int4Linear, DynamicMatchesCompositeAndIsIdenticalInEveryBuild) {
  for (auto dtype : fuseops::testing::kDtypes) {
    for (const auto& [m, n, k, group_size] :
         std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
             {1, 16, 32, 32}, {3, 37, 10, 4}, {9, 40, 300, 12}, {61, 33, 256, 128}}) {
      const at::Tensor w = at::randn({n, k}, options());
      const auto [wq, scale, zero] = fuseops::quantize_per_group_int4(w, group_size, m % 2 == 1);
      const auto [packed, scale_zero] = fuseops::pack_int4_weight(wq, scale, zero, group_size);
      const at::Tensor x = at::randn({m, k}, options()).to(dtype);
      const at::Tensor bias = at::randn({n}, options()).to(dtype);
      const int64_t groups = (k + group_size - 1) / group_size;
      const int64_t padded = groups * group_size;
      const at::Tensor x_groups =
          at::constant_pad_nd(x.to(at::kFloat), {0, padded - k}, 0).view({m * groups, group_size});
      const auto [xq, x_scale] = fuseops::quantize_per_token_int8(x_groups);
      // x dequantized group by group (exact in float64), zeros past K.
      const at::Tensor x_dequantized =
          (xq.to(at::kDouble) * x_scale.to(at::kDouble).unsqueeze(1)).view({m, padded});
      const at::Tensor want =
          at::matmul(x_dequantized.narrow(1, 0, k), dequantize(wq, scale, zero, group_size).t()) +
          bias.to(at::kDouble);
      std::optional<at::Tensor> first;
      for (auto capability : fuseops::cpu::runnable_capabilities()) {
        fuseops::cpu::ScopedCapabilityOverride forced(capability);
        SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype
                                        << " m " << m << " n " << n << " k " << k);
        const at::Tensor y = fuseops::int4_dynamic_linear(x, packed, scale_zero, group_size, bias);
        ASSERT_EQ(y.scalar_type(), dtype);
        ASSERT_EQ(y.sizes(), at::IntArrayRef({m, n}));
        const double scale_of_y = std::max(1.0, want.abs().max().item<double>());
        EXPECT_TRUE(at::allclose(y.to(at::kDouble), want, linear_tolerance(dtype),
                                 linear_tolerance(dtype) * scale_of_y))
            << (y.to(at::kDouble) - want).abs().max().item<double>();
        if (first) {
          EXPECT_TRUE(at::equal(y, *first));
        } else {
          first = y;
        }
      }
    }
  }
}

TEST(Int4Linear, BadInputsNameOpAndArgument) {
  const auto [wq, scale, zero] = fuseops::quantize_per_group_int4(at::randn({20, 64}), 32);
  const auto [packed, scale_zero] = fuseops::pack_int4_weight(wq, scale, zero, 32);
  const char* op = "fuseops::int4_weight_only_linear";
  expect_error_mentions(
      [&] { fuseops::int4_weight_only_linear(at::randn({2, 65}), packed, scale_zero, 32); },
      {op, "'input'", "K = 65"});
  expect_error_mentions(
      [&] { fuseops::int4_weight_only_linear(at::randn({2, 64}), packed, scale_zero, 64); },
      {op, "'packed'", "group_size"});
  expect_error_mentions(
      [&] { fuseops::int4_weight_only_linear(at::randn({2, 64}), packed, scale_zero, 3); },
      {op, "'group_size'", "even"});
  expect_error_mentions(
      [&] {
        fuseops::int4_weight_only_linear(at::randn({2, 64}), packed.to(at::kChar), scale_zero, 32);
      },
      {op, "'packed'", "uint8"});
  expect_error_mentions(
      [&] {
        fuseops::int4_weight_only_linear(at::randn({2, 64}), packed, scale_zero.narrow(2, 0, 5),
                                         32);
      },
      {op, "'packed'", "'scale_zero'", "N = 5"});
  expect_error_mentions(
      [&] {
        fuseops::int4_weight_only_linear(at::randn({2, 64}), packed, scale_zero, 32,
                                         at::randn({19}));
      },
      {op, "'bias'", "[20]"});
  expect_error_mentions([&] { fuseops::pack_int4_weight(wq.to(at::kChar), scale, zero, 32); },
                        {"fuseops::pack_int4_weight", "'wq'", "uint8"});
  expect_error_mentions([&] { fuseops::pack_int4_weight(wq + 16, scale, zero, 32); },
                        {"fuseops::pack_int4_weight", "'wq'", "[0, 15]"});
  expect_error_mentions([&] { fuseops::pack_int4_weight(wq, scale, zero, 16); },
                        {"fuseops::pack_int4_weight", "'scale'", "group_size"});
  at::Tensor bad = at::randn({4, 8});
  bad[1][2] = std::numeric_limits<float>::infinity();
  expect_error_mentions([&] { fuseops::quantize_per_group_int4(bad, 4); },
                        {"fuseops::quantize_per_group_int4", "'weight'", "finite"});
  expect_error_mentions([&] { fuseops::quantize_per_group_int4(at::randn({4, 8}), 0); },
                        {"fuseops::quantize_per_group_int4", "'group_size'", "positive"});
}

}  // namespace
