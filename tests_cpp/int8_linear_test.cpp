// fuseops int8 linear ops through the dispatcher, against ATen composites:
// the packed layout against its definition, int8_weight_only_linear against
// x @ (wq * scale).T + bias in float64, int8_dynamic_linear against its
// quantized math in float64 (and the same bits from every build), in every
// CPU build this CPU runs.

#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fuseops/fuseops.h>

#include "ops/cpu/dispatch.h"
#include "test_helpers.h"

namespace {

using fuseops::testing::expect_error_mentions;
using fuseops::testing::linear_tolerance;

class Int8Linear : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(Int8Linear);

at::Tensor random_int8(at::IntArrayRef shape, at::Device device = at::kCPU) {
  return at::randint(-127, 128, shape, at::TensorOptions().dtype(at::kChar).device(device));
}

TEST_P(Int8Linear, PackedLayoutFollowsItsDefinition) {
  const at::Tensor wq = random_int8({37, 10}, device());
  const at::Tensor scale = at::rand({37}, options());
  const auto [packed, scale_copy, colsum] = fuseops::pack_int8_weight(wq, scale);
  ASSERT_EQ(packed.sizes(), at::IntArrayRef({3, 3, 16, 4}));
  for (int64_t n = 0; n < 48; ++n) {
    for (int64_t k = 0; k < 12; ++k) {
      const int64_t want = n < 37 && k < 10 ? wq[n][k].item<int64_t>() : 0;
      ASSERT_EQ(packed[n / 16][k / 4][n % 16][k % 4].item<int64_t>(), want) << n << " " << k;
    }
  }
  EXPECT_TRUE(at::equal(scale_copy, scale));
  // K = 10: one activation block, each channel's whole sum, as int16.
  EXPECT_TRUE(at::equal(colsum, wq.sum(1, false, at::kShort).view({1, 37})));
  // K = 70: blocks [0, 32), [32, 64), [64, 70).
  const at::Tensor wide = random_int8({5, 70}, device());
  const at::Tensor wide_colsum =
      std::get<2>(fuseops::pack_int8_weight(wide, at::rand({5}, options())));
  ASSERT_EQ(wide_colsum.sizes(), at::IntArrayRef({3, 5}));
  for (int64_t b = 0; b < 3; ++b) {
    const int64_t start = 32 * b;
    const int64_t count = std::min<int64_t>(32, 70 - start);
    EXPECT_TRUE(at::equal(wide_colsum[b], wide.narrow(1, start, count).sum(1, false, at::kShort)));
  }
}

TEST_P(Int8Linear, WeightOnlyMatchesCompositeInEveryBuild) {
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride forced(capability);
    for (auto dtype : fuseops::testing::kDtypes) {
      for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
               {1, 16, 4}, {3, 37, 10}, {7, 40, 129}, {61, 33, 64}, {2, 1, 1}}) {
        SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype
                                        << " m " << m << " n " << n << " k " << k);
        const at::Tensor wq = random_int8({n, k}, device());
        const at::Tensor scale = at::rand({n}, options()) * 0.01 + 1e-3;
        const auto [packed, s, colsum] = fuseops::pack_int8_weight(wq, scale);
        const at::Tensor x = at::randn({m, k}, options()).to(dtype);
        const at::Tensor bias = at::randn({n}, options()).to(dtype);
        for (bool with_bias : {false, true}) {
          const at::Tensor y = fuseops::int8_weight_only_linear(
              x, packed, s, with_bias ? std::optional<at::Tensor>(bias) : std::nullopt);
          at::Tensor want =
              at::matmul(x.to(at::kDouble), wq.to(at::kDouble).t()) * scale.to(at::kDouble);
          if (with_bias) {
            want = want + bias.to(at::kDouble);
          }
          ASSERT_EQ(y.scalar_type(), dtype);
          ASSERT_EQ(y.sizes(), at::IntArrayRef({m, n}));
          const double scale_of_y = std::max(1.0, want.abs().max().item<double>());
          EXPECT_TRUE(at::allclose(y.to(at::kDouble), want, linear_tolerance(dtype),
                                   linear_tolerance(dtype) * scale_of_y))
              << (y.to(at::kDouble) - want).abs().max().item<double>();
        }
      }
    }
  }
}

// int8_dynamic_linear's math with ATen ops in float64: each block of 32 of
// a row (zeros past K) quantized (float32, as quantize_per_token_int8
// quantizes a row), the int8 products summed exactly (|sum| < 2^53), each
// block's sum times its scale, summed, then times scale and plus the bias.
// The op sums each block exactly in int32 too, so only its float32
// epilogue rounds: one fused multiply-add per block into the running sum,
// the channel's scale and the bias add; 2e-6 * sqrt(K) of max|y| covers it
// (as the weight-only op's float32 sums). Reduced dtypes round the result
// once more.
at::Tensor dynamic_composite(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& scale,
                             const std::optional<at::Tensor>& bias) {
  const int64_t m = x.size(0);
  const int64_t n = wq.size(0);
  const int64_t k = x.size(1);
  const int64_t blocks = (k + 31) / 32;
  const int64_t pad = blocks * 32 - k;
  const at::Tensor xf = at::constant_pad_nd(x.to(at::kFloat), {0, pad}, 0).view({m, blocks, 32});
  // Through float64: correctly rounded on CUDA too (see quantize_test.cpp).
  at::Tensor xs = (xf.abs().amax({-1}, true).to(at::kDouble) / 127.0).to(at::kFloat);
  xs = at::where(xs == 0, at::ones_like(xs), xs);
  const at::Tensor xq = at::round(xf / xs).clamp(-127, 127);
  const at::Tensor w =
      at::constant_pad_nd(wq.to(at::kDouble), {0, pad}, 0).view({n, blocks, 32}).permute({1, 2, 0});
  // [blocks, m, 32] @ [blocks, 32, n]: each block's exact sums.
  const at::Tensor per_block = at::bmm(xq.to(at::kDouble).permute({1, 0, 2}), w);
  at::Tensor y = (per_block * xs.to(at::kDouble).permute({1, 0, 2})).sum(0) * scale.to(at::kDouble);
  return bias ? y + bias->to(at::kDouble) : y;
}

TEST_P(Int8Linear, DynamicMatchesCompositeAndIsIdenticalInEveryBuild) {
  for (auto dtype : fuseops::testing::kDtypes) {
    for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {1, 16, 4}, {3, 37, 10}, {7, 40, 129}, {61, 33, 300}, {2, 1, 1}}) {
      const at::Tensor wq = random_int8({n, k}, device());
      const at::Tensor scale = at::rand({n}, options()) * 0.01 + 1e-3;
      const auto [packed, s, colsum] = fuseops::pack_int8_weight(wq, scale);
      at::Tensor x = at::randn({m, k}, options()).to(dtype);
      x[0].zero_();  // an all-zero row: scale 1, y = bias
      const at::Tensor bias = at::randn({n}, options()).to(dtype);
      const at::Tensor want = dynamic_composite(x, wq, scale, bias);
      const double tol = dtype == at::kFloat || dtype == at::kDouble
                             ? 2e-6 * std::sqrt(static_cast<double>(k))
                             : linear_tolerance(dtype);
      std::optional<at::Tensor> first;
      for (auto capability : fuseops::cpu::runnable_capabilities()) {
        fuseops::cpu::ScopedCapabilityOverride forced(capability);
        SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype
                                        << " m " << m << " n " << n << " k " << k);
        const at::Tensor y = fuseops::int8_dynamic_linear(x, packed, s, colsum, bias);
        ASSERT_EQ(y.scalar_type(), dtype);
        ASSERT_EQ(y.sizes(), at::IntArrayRef({m, n}));
        const double scale_of_y = std::max(1.0, want.abs().max().item<double>());
        EXPECT_TRUE(at::allclose(y.to(at::kDouble), want, tol, tol * scale_of_y))
            << (y.to(at::kDouble) - want).abs().max().item<double>();
        // Exact int32 sums and the same epilogue: the same bits everywhere.
        if (first) {
          EXPECT_TRUE(at::equal(y, *first));
        } else {
          first = y;
        }
      }
    }
  }
}

TEST(Int8Linear, BadInputsNameOpAndArgument) {
  const at::Tensor wq = random_int8({20, 12});
  const auto [packed, scale, colsum] = fuseops::pack_int8_weight(wq, at::rand({20}));
  const char* op = "fuseops::int8_weight_only_linear";
  expect_error_mentions(
      [&] { fuseops::int8_weight_only_linear(at::randn({2, 13}), packed, scale); },
      {op, "'input'", "K = 13", "'packed'"});
  expect_error_mentions(
      [&] { fuseops::int8_weight_only_linear(at::randn({2, 12}), packed.to(at::kFloat), scale); },
      {op, "'packed'", "int8"});
  expect_error_mentions(
      [&] { fuseops::int8_weight_only_linear(at::randn({2, 12}), packed, scale.narrow(0, 0, 5)); },
      {op, "'packed'", "'scale'", "N = 5"});
  expect_error_mentions(
      [&] { fuseops::int8_weight_only_linear(at::randn({2, 12}), packed, scale.to(at::kDouble)); },
      {op, "'scale'", "float32"});
  expect_error_mentions(
      [&] { fuseops::int8_weight_only_linear(at::randn({2, 12}), packed, scale, at::randn({19})); },
      {op, "'bias'", "[20]"});
  expect_error_mentions(
      [&] { fuseops::int8_weight_only_linear(at::randint(0, 3, {2, 12}), packed, scale); },
      {op, "'input'", "dtype"});
  const char* dyn = "fuseops::int8_dynamic_linear";
  expect_error_mentions(
      [&] {
        fuseops::int8_dynamic_linear(at::randn({2, 12}), packed, scale, colsum.to(at::kLong));
      },
      {dyn, "'colsum'", "int16"});
  expect_error_mentions(
      [&] {
        fuseops::int8_dynamic_linear(at::randn({2, 12}), packed, scale, colsum.narrow(1, 0, 3));
      },
      {dyn, "'colsum'", "[1, 20]"});
  expect_error_mentions(
      [&] { fuseops::int8_dynamic_linear(at::randn({2, 13}), packed, scale, colsum); },
      {dyn, "'input'", "K = 13"});
  expect_error_mentions([&] { fuseops::pack_int8_weight(wq.to(at::kFloat), at::rand({20})); },
                        {"fuseops::pack_int8_weight", "'wq'", "int8"});
  expect_error_mentions([&] { fuseops::pack_int8_weight(wq, at::rand({12})); },
                        {"fuseops::pack_int8_weight", "'scale'", "[20]"});
}

}  // namespace
