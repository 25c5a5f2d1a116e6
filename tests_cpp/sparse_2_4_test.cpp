// fuseops 2:4 sparse ops through the dispatcher, against ATen composites:
// prune_2_4 against its definition, the packed layout against its
// definition, sparse_2_4_linear against x @ (W * scale).T + bias in float64
// with the dense pruned weight, in every CPU build this CPU runs;
// sparse_2_4_dynamic_linear against int8_dynamic_linear's math in float64
// and, bit for bit, against int8_dynamic_linear on the dense weight.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fuseops/fuseops.h>

#include "ops/cpu/dispatch.h"
#include "test_helpers.h"

namespace {

using fuseops::testing::expect_error_mentions;
using fuseops::testing::linear_tolerance;

TEST(Sparse24, PruneKeepsTheTwoLargestMagnitudesLowerIndexOnTies) {
  const at::Tensor w =
      at::tensor({1.0, -3.0, 2.0, 0.5, 2.0, -2.0, 2.0, 1.0, 0.0, 0.0, 0.0, 5.0}).view({1, 12});
  const at::Tensor want =
      at::tensor({0.0, -3.0, 2.0, 0.0, 2.0, -2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0}).view({1, 12});
  for (auto dtype : fuseops::testing::kDtypes) {
    EXPECT_TRUE(at::equal(fuseops::prune_2_4(w.to(dtype)), want.to(dtype))) << dtype;
  }
  const at::Tensor random = at::randn({33, 64});
  const at::Tensor pruned = fuseops::prune_2_4(random);
  EXPECT_TRUE(at::equal(pruned.ne(0).view({33, 16, 4}).sum(-1), at::full({33, 16}, 2, at::kLong)));
  // Every kept magnitude is at least every dropped one of its group.
  const at::Tensor kept = pruned.ne(0).view({33, 16, 4});
  const at::Tensor mag = random.abs().view({33, 16, 4});
  const at::Tensor kept_min = at::where(kept, mag, at::full_like(mag, 1e30)).amin(-1);
  const at::Tensor dropped_max = at::where(kept, at::zeros_like(mag), mag).amax(-1);
  EXPECT_TRUE(kept_min.ge(dropped_max).all().item<bool>());
}

TEST(Sparse24, PackedLayoutFollowsItsDefinition) {
  const at::Tensor w = fuseops::prune_2_4(at::randn({5, 12}));
  const auto [values, meta, scale] = fuseops::pack_2_4(w);
  ASSERT_EQ(values.sizes(), at::IntArrayRef({5, 6}));
  ASSERT_EQ(meta.sizes(), at::IntArrayRef({5, 2}));
  ASSERT_EQ(meta.scalar_type(), at::kByte);
  EXPECT_TRUE(at::equal(scale, at::ones({5})));
  for (int64_t n = 0; n < 5; ++n) {
    int64_t next = 0;
    for (int64_t k = 0; k < 12; ++k) {
      const bool kept = (meta[n][k / 8].item<int64_t>() >> (k % 8)) & 1;
      ASSERT_EQ(kept, w[n][k].item<float>() != 0.0f) << n << " " << k;
      if (kept) {
        ASSERT_EQ(values[n][next++].item<float>(), w[n][k].item<float>());
      }
    }
    ASSERT_EQ(next, 6);
    // K = 12: three groups, the last byte's high nibble unused.
    ASSERT_EQ(meta[n][1].item<int64_t>() >> 4, 0);
  }
}

void expect_matches(const at::Tensor& y, const at::Tensor& want, at::ScalarType dtype) {
  const double scale_of_y = std::max(1.0, want.abs().max().item<double>());
  EXPECT_TRUE(at::allclose(y.to(at::kDouble), want, linear_tolerance(dtype),
                           linear_tolerance(dtype) * scale_of_y))
      << (y.to(at::kDouble) - want).abs().max().item<double>();
}

TEST(Sparse24, LinearMatchesCompositeInEveryBuild) {
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride forced(capability);
    for (auto dtype : fuseops::testing::kDtypes) {
      for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
               {1, 16, 4}, {3, 37, 12}, {7, 40, 132}, {61, 33, 64}, {2, 1, 8}}) {
        SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype
                                        << " m " << m << " n " << n << " k " << k);
        const at::Tensor w = fuseops::prune_2_4(at::randn({n, k}).to(dtype));
        const at::Tensor x = at::randn({m, k}).to(dtype);
        const at::Tensor bias = at::randn({n}).to(dtype);
        const auto [values, meta, scale] = fuseops::pack_2_4(w);
        const at::Tensor y = fuseops::sparse_2_4_linear(x, values, meta, scale, bias);
        ASSERT_EQ(y.scalar_type(), dtype);
        ASSERT_EQ(y.sizes(), at::IntArrayRef({m, n}));
        expect_matches(
            y, at::matmul(x.to(at::kDouble), w.to(at::kDouble).t()) + bias.to(at::kDouble), dtype);
        // int8 values with per-channel scales (W8A16).
        const auto [wq, wscale] = fuseops::quantize_per_channel_int8(w.to(at::kFloat));
        const auto [qvalues, qmeta, qscale] = fuseops::pack_2_4(wq, wscale);
        const at::Tensor yq = fuseops::sparse_2_4_linear(x, qvalues, qmeta, qscale);
        ASSERT_EQ(yq.scalar_type(), dtype);
        expect_matches(
            yq, at::matmul(x.to(at::kDouble), wq.to(at::kDouble).t()) * wscale.to(at::kDouble),
            dtype);
      }
    }
  }
}

// int8_dynamic_linear's math with ATen ops in float64: the rows quantized
// (float32, as quantize_per_token_int8), the int8 products summed exactly
// (|sum| < 2^53), then x_scale * scale and the bias. The op sums exactly in
// int32 too, so only its float32 epilogue rounds: float(acc), two products
// and the bias add, under 4 * 2^-24 relative; 1e-6 of max|y| covers it.
at::Tensor dynamic_composite(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& scale,
                             const at::Tensor& bias) {
  const at::Tensor xf = x.to(at::kFloat);
  // Through float64: correctly rounded on CUDA too (see quantize_test.cpp).
  at::Tensor xs = (xf.abs().amax({-1}, true).to(at::kDouble) / 127.0).to(at::kFloat);
  xs = at::where(xs == 0, at::ones_like(xs), xs);
  const at::Tensor xq = at::round(xf / xs).clamp(-127, 127);
  return at::matmul(xq.to(at::kDouble), wq.to(at::kDouble).t()) * xs.to(at::kDouble) *
             scale.to(at::kDouble) +
         bias.to(at::kDouble);
}

TEST(Sparse24, DynamicMatchesCompositeInEveryBuild) {
  for (auto dtype : fuseops::testing::kDtypes) {
    for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {1, 16, 4}, {3, 37, 12}, {2, 33, 200}, {7, 40, 132}, {61, 33, 64}}) {
      const auto [wq, wscale] =
          fuseops::quantize_per_channel_int8(fuseops::prune_2_4(at::randn({n, k})));
      const auto [values, meta, scale] = fuseops::pack_2_4(wq, wscale);
      const at::Tensor colsum = values.sum(1, false, at::kInt);
      at::Tensor x = at::randn({m, k}).to(dtype);
      x[0].zero_();  // an all-zero row: scale 1, y = bias
      const at::Tensor bias = at::randn({n}).to(dtype);
      const at::Tensor want = dynamic_composite(x, wq, wscale, bias);
      const double tol =
          dtype == at::kFloat || dtype == at::kDouble ? 1e-6 : linear_tolerance(dtype);
      for (auto capability : fuseops::cpu::runnable_capabilities()) {
        fuseops::cpu::ScopedCapabilityOverride forced(capability);
        SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype
                                        << " m " << m << " n " << n << " k " << k);
        const at::Tensor y =
            fuseops::sparse_2_4_dynamic_linear(x, values, meta, scale, colsum, bias);
        ASSERT_EQ(y.scalar_type(), dtype);
        ASSERT_EQ(y.sizes(), at::IntArrayRef({m, n}));
        const double scale_of_y = std::max(1.0, want.abs().max().item<double>());
        EXPECT_TRUE(at::allclose(y.to(at::kDouble), want, tol, tol * scale_of_y))
            << (y.to(at::kDouble) - want).abs().max().item<double>();
      }
    }
  }
}

TEST(Sparse24, DynamicBadInputsNameOpAndArgument) {
  const auto [wq, wscale] =
      fuseops::quantize_per_channel_int8(fuseops::prune_2_4(at::randn({20, 16})));
  const auto [values, meta, scale] = fuseops::pack_2_4(wq, wscale);
  const at::Tensor colsum = values.sum(1, false, at::kInt);
  const char* op = "fuseops::sparse_2_4_dynamic_linear";
  const at::Tensor x = at::randn({2, 16});
  expect_error_mentions(
      [&] { fuseops::sparse_2_4_dynamic_linear(x, values.to(at::kFloat), meta, scale, colsum); },
      {op, "'values'", "int8"});
  expect_error_mentions(
      [&] { fuseops::sparse_2_4_dynamic_linear(x, values, meta, scale, colsum.to(at::kLong)); },
      {op, "'colsum'", "int32"});
  expect_error_mentions(
      [&] { fuseops::sparse_2_4_dynamic_linear(x, values, meta, scale, colsum.narrow(0, 0, 3)); },
      {op, "'colsum'", "[20]"});
  expect_error_mentions(
      [&] { fuseops::sparse_2_4_dynamic_linear(at::randn({2, 12}), values, meta, scale, colsum); },
      {op, "'input'", "K = 12"});
}

TEST(Sparse24, BadInputsNameOpAndArgument) {
  const at::Tensor w = fuseops::prune_2_4(at::randn({20, 16}));
  const auto [values, meta, scale] = fuseops::pack_2_4(w);
  const char* op = "fuseops::sparse_2_4_linear";
  const at::Tensor x = at::randn({2, 16});
  expect_error_mentions(
      [&] { fuseops::sparse_2_4_linear(at::randn({2, 12}), values, meta, scale); },
      {op, "'input'", "K = 12", "'values'"});
  expect_error_mentions([&] { fuseops::sparse_2_4_linear(x, values.to(at::kDouble), meta, scale); },
                        {op, "'values'", "dtype"});
  expect_error_mentions([&] { fuseops::sparse_2_4_linear(x, values, meta.to(at::kInt), scale); },
                        {op, "'meta'", "uint8"});
  expect_error_mentions([&] { fuseops::sparse_2_4_linear(x, values, meta.narrow(0, 0, 3), scale); },
                        {op, "'meta'", "[20, 2]"});
  expect_error_mentions([&] { fuseops::sparse_2_4_linear(x, values, meta, scale.narrow(0, 0, 3)); },
                        {op, "'scale'", "[20]"});
  expect_error_mentions(
      [&] { fuseops::sparse_2_4_linear(x, values, meta, scale, at::randn({19})); },
      {op, "'bias'", "[20]"});
  const char* pack = "fuseops::pack_2_4";
  expect_error_mentions([&] { fuseops::pack_2_4(at::randn({4, 8})); },
                        {pack, "'weight'", "not 2:4", "row 0, group 0"});
  expect_error_mentions([&] { fuseops::pack_2_4(at::zeros({4, 6})); },
                        {pack, "'weight'", "multiple of 4"});
  expect_error_mentions([&] { fuseops::pack_2_4(at::zeros({4, 8}, at::kChar)); },
                        {pack, "'scale'", "required"});
  expect_error_mentions([&] { fuseops::prune_2_4(at::zeros({4, 8}, at::kChar)); },
                        {"fuseops::prune_2_4", "'weight'", "dtype"});
}

}  // namespace
