// fuseops int8 quantization through the dispatcher, against an ATen
// composite of the same math (float32: absmax / 127, round half to even,
// clamp): q and scale must be identical in every dtype and CPU build.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fuseops/fuseops.h>

#include "ops/cpu/dispatch.h"
#include "test_helpers.h"

namespace {

using fuseops::testing::expect_error_mentions;
using fuseops::testing::kDtypes;

class Quantize : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(Quantize);

std::tuple<at::Tensor, at::Tensor> composite_quantize(const at::Tensor& x) {
  const at::Tensor xf = x.to(at::kFloat);
  // An empty row's absmax is 0 (max() refuses empty rows). absmax / 127 goes
  // through float64: ATen's CUDA division by a scalar multiplies by its
  // reciprocal (1 ulp off), while a float64 quotient rounded to float32 is the
  // correctly rounded float32 division the kernels compute.
  at::Tensor scale = xf.size(-1) == 0
                         ? at::zeros(xf.sizes().slice(0, xf.dim() - 1), xf.options())
                         : (std::get<0>(xf.abs().max(-1)).to(at::kDouble) / 127.0).to(at::kFloat);
  scale = at::where(scale == 0, at::ones_like(scale), scale);
  const at::Tensor q = at::round(xf / scale.unsqueeze(-1)).clamp(-127, 127).to(at::kChar);
  return {q, scale};
}

void expect_equal(const at::Tensor& actual, const at::Tensor& expected) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type());
  EXPECT_TRUE(at::equal(actual, expected));
}

const std::vector<std::vector<int64_t>> kShapes = {{1, 1}, {3, 17},   {5, 0},
                                                   {0, 4}, {64, 301}, {2, 3, 40}};

TEST_P(Quantize, MatchesCompositeInEveryBuildAndDtype) {
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride forced(capability);
    for (auto dtype : kDtypes) {
      for (const auto& shape : kShapes) {
        SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype
                                        << " " << at::IntArrayRef(shape));
        at::Tensor x = at::randn(shape, options(dtype)) * 3;
        if (x.size(0) > 1 && x.size(-1) > 0) {
          x.select(0, 1).zero_();  // an all-zero row gets scale 1
        }
        const auto [want_q, want_scale] = composite_quantize(x);
        const auto [q, scale] = shape.size() == 2 ? fuseops::quantize_per_channel_int8(x)
                                                  : fuseops::quantize_per_token_int8(x);
        expect_equal(q, want_q);
        expect_equal(scale, want_scale);
        const auto [tq, tscale] =
            fuseops::quantize_per_token_int8(x.transpose(0, -1).contiguous().transpose(0, -1));
        expect_equal(tq, want_q);
        expect_equal(tscale, want_scale);
      }
    }
  }
}

TEST_P(Quantize, DequantizeMatchesComposite) {
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride forced(capability);
    const at::Tensor q = at::randint(-127, 128, {4, 37, 5}, options(at::kChar));
    for (int64_t dim : {0, 1, 2, -1}) {
      std::vector<int64_t> shape = {4, 37, 5};
      shape.erase(shape.begin() + (dim < 0 ? dim + 3 : dim));
      const at::Tensor scale = at::rand(shape, options()) + 0.1;
      for (auto dtype : kDtypes) {
        SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " dim "
                                        << dim << " " << dtype);
        const at::Tensor out = fuseops::dequantize_int8(q, scale, dim, dtype);
        const at::Tensor want =
            (dtype == at::kDouble ? q.to(at::kDouble) * scale.to(at::kDouble).unsqueeze(dim)
                                  : q.to(at::kFloat) * scale.unsqueeze(dim))
                .to(dtype);
        expect_equal(out, want);
      }
    }
  }
}

TEST_P(Quantize, BadInputsNameOpAndArgument) {
  expect_error_mentions(
      [&] { fuseops::quantize_per_channel_int8(at::randn({2, 3, 4}, options())); },
      {"fuseops::quantize_per_channel_int8", "'weight'", "2-D"});
  expect_error_mentions(
      [&] { fuseops::quantize_per_channel_int8(at::ones({2, 3}, options(at::kInt))); },
      {"fuseops::quantize_per_channel_int8", "'weight'", "dtype"});
  at::Tensor x = at::randn({3, 8}, options());
  x[2][5] = std::numeric_limits<float>::infinity();
  expect_error_mentions([&] { fuseops::quantize_per_token_int8(x); },
                        {"fuseops::quantize_per_token_int8", "'input'", "row 2", "Inf or NaN"});
  const at::Tensor q = at::zeros({3, 8}, options(at::kChar));
  expect_error_mentions(
      [&] { fuseops::dequantize_int8(q.to(at::kFloat), at::ones({3}, options())); },
      {"fuseops::dequantize_int8", "'q'", "int8"});
  expect_error_mentions([&] { fuseops::dequantize_int8(q, at::ones({8}, options())); },
                        {"fuseops::dequantize_int8", "'scale'", "shape"});
  expect_error_mentions([&] { fuseops::dequantize_int8(q, at::ones({3}, options(at::kDouble))); },
                        {"fuseops::dequantize_int8", "'scale'", "float32"});
}

}  // namespace
