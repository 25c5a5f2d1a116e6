// fuseops::rms_norm and fuseops::fused_add_rms_norm through the dispatcher,
// forward and backward, against an ATen composite computed in float64.
//
// Tolerances: float32 within 1e-5 relative (+1e-6 absolute) of the float64
// result: a row's sum of squares is accumulated in float32 lanes of at most a
// few hundred terms each (relative error ~1e-6), then one rsqrt and two
// multiplies. float64: 1e-10. bfloat16/float16 are computed in float32 and
// rounded once, so they sit within one rounding of the exact result: 1e-2
// relative (bf16 has 8 bits of mantissa) and 1e-3 for float16, plus a small
// absolute term for values near zero.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <fuseops/fuseops.h>

#include "test_helpers.h"

#include "ops/cpu/dispatch.h"

namespace {

using fuseops::testing::expect_error_mentions;
using fuseops::testing::kDtypes;

class RmsNorm : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(RmsNorm);
class FusedAddRmsNorm : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(FusedAddRmsNorm);

// Rows of widths that cover: a single element, tails shorter than any vector,
// exact multiples of 8/16/32 lanes, several row blocks per thread, empty
// tensors (no rows, and rows of width zero).
const std::vector<std::vector<int64_t>> kShapes = {{1, 1},    {7, 33}, {4, 3, 64}, {2, 4099},
                                                   {300, 96}, {5},     {0, 16},    {3, 0}};

struct Tolerance {
  double rtol;
  double atol;
};

Tolerance tolerance(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble:
      return {1e-10, 1e-12};
    case at::kFloat:
      return {1e-5, 1e-6};
    case at::kHalf:
      return {1e-3, 1e-3};
    default:
      return {1e-2, 1e-2};
  }
}

// `scale` multiplies the absolute floor: the size of the terms a result is
// the difference of, where that exceeds 1 (see BackwardMatchesFloat64Autograd).
void expect_close(const at::Tensor& actual, const at::Tensor& expected, at::ScalarType dtype,
                  double scale = 1.0) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  Tolerance tol = tolerance(dtype);
  tol.atol *= std::max(1.0, scale);
  const at::Tensor a = actual.to(at::kDouble);
  const at::Tensor e = expected.to(at::kDouble);
  EXPECT_TRUE(at::equal(a.isnan(), e.isnan()));
  EXPECT_TRUE(at::allclose(a.nan_to_num(0), e.nan_to_num(0), tol.rtol, tol.atol))
      << "max abs diff " << (a - e).abs().nan_to_num(0).max().item<double>();
}

double default_eps(at::ScalarType dtype) {
  return dtype == at::kDouble ? std::numeric_limits<double>::epsilon()
                              : std::numeric_limits<float>::epsilon();
}

// out = x * rsqrt(mean(x^2) + eps) * w in float64, with autograd.
at::Tensor composite(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor y = x * (x.pow(2).mean(-1, true) + eps).rsqrt();
  return w.defined() ? y * w : y;
}

at::Tensor as_double_leaf(const at::Tensor& t) {
  return t.defined() ? t.detach().to(at::kDouble).requires_grad_() : t;
}

TEST_P(RmsNorm, ForwardMatchesFloat64Composite) {
  for (auto dtype : kDtypes) {
    for (const auto& shape : kShapes) {
      for (bool with_weight : {true, false}) {
        SCOPED_TRACE(testing::Message()
                     << dtype << " " << at::IntArrayRef(shape) << " weight=" << with_weight);
        const at::Tensor x = at::randn(shape, options(dtype));
        const at::Tensor w = with_weight ? at::randn({shape.back()}, options(dtype)) : at::Tensor();
        const at::Tensor y = fuseops::rms_norm(x, w, 1e-6);
        EXPECT_EQ(y.scalar_type(), dtype);
        EXPECT_TRUE(y.is_contiguous());
        const at::Tensor expected =
            composite(x.to(at::kDouble), w.defined() ? w.to(at::kDouble) : w, 1e-6);
        expect_close(y, expected.to(dtype), dtype);
        // The default eps is PyTorch's.
        const at::Tensor y_default = fuseops::rms_norm(x, w);
        expect_close(
            y_default,
            composite(x.to(at::kDouble), w.defined() ? w.to(at::kDouble) : w, default_eps(dtype))
                .to(dtype),
            dtype);
      }
    }
  }
}

TEST_P(RmsNorm, BackwardMatchesFloat64Autograd) {
  for (auto dtype : kDtypes) {
    for (const auto& shape : kShapes) {
      for (bool with_weight : {true, false}) {
        SCOPED_TRACE(testing::Message()
                     << dtype << " " << at::IntArrayRef(shape) << " weight=" << with_weight);
        const at::Tensor x = at::randn(shape, options(dtype));
        const at::Tensor w = with_weight ? at::randn({shape.back()}, options(dtype)) : at::Tensor();
        const at::Tensor grad = at::randn(shape, options(dtype));
        auto [y, rstd] = fuseops::rms_norm_forward(x, w, 1e-5);
        EXPECT_EQ(rstd.scalar_type(), dtype == at::kDouble ? at::kDouble : at::kFloat);
        EXPECT_EQ(rstd.sizes(), x.sizes().slice(0, x.dim() - 1));
        auto [grad_x, grad_w] = fuseops::rms_norm_backward(grad, x, w, rstd);

        const at::Tensor xd = as_double_leaf(x);
        const at::Tensor wd = as_double_leaf(w);
        composite(xd, wd, 1e-5).backward(grad.to(at::kDouble));
        if (x.numel() > 0) {
          // grad_x = rstd * (g w - y (g w . y) / n): a difference of terms of
          // size |g w| rstd, which cancels where the row's x^2 dwarfs eps
          // (a one-element row: 1 - x^2 / (x^2 + eps)), so float32 is
          // accurate relative to that size, not to the small result.
          const at::Tensor gw =
              with_weight ? grad.to(at::kDouble) * wd.detach() : grad.to(at::kDouble);
          const double term_size =
              (gw.abs() * rstd.to(at::kDouble).unsqueeze(-1)).max().item<double>();
          expect_close(grad_x, xd.grad().to(dtype), dtype, term_size);
        }
        EXPECT_EQ(grad_x.sizes(), x.sizes());
        if (with_weight) {
          EXPECT_EQ(grad_w.scalar_type(), dtype);
          const at::Tensor expected_w = wd.grad().defined() ? wd.grad() : at::zeros_like(wd);
          // The weight gradient sums over rows: its error grows with the row
          // count, so compare with a tolerance scaled by it.
          const double rows = static_cast<double>(
              std::max<int64_t>(1, x.numel() / std::max<int64_t>(1, shape.back())));
          const Tolerance tol = tolerance(dtype);
          EXPECT_TRUE(at::allclose(grad_w.to(at::kDouble), expected_w, tol.rtol,
                                   tol.atol * std::sqrt(rows)))
              << (grad_w.to(at::kDouble) - expected_w).abs().max().item<double>();
        } else {
          EXPECT_EQ(grad_w.numel(), 0);
        }
      }
    }
  }
}

TEST_P(FusedAddRmsNorm, ForwardAndBackwardMatchUnfusedComposite) {
  for (auto dtype : kDtypes) {
    for (const auto& shape : kShapes) {
      SCOPED_TRACE(testing::Message() << dtype << " " << at::IntArrayRef(shape));
      const at::Tensor x = at::randn(shape, options(dtype));
      const at::Tensor residual = at::randn(shape, options(dtype));
      const at::Tensor w = at::randn({shape.back()}, options(dtype));
      auto [out, new_residual] = fuseops::fused_add_rms_norm(x, residual, w, 1e-6);
      // The sum is rounded to the dtype exactly as ATen's add rounds it.
      EXPECT_TRUE(at::equal(new_residual, x + residual));
      expect_close(
          out, composite((x + residual).to(at::kDouble), w.to(at::kDouble), 1e-6).to(dtype), dtype);

      const at::Tensor grad_out = at::randn(shape, options(dtype));
      const at::Tensor grad_res = at::randn(shape, options(dtype));
      auto [out2, new_res2, rstd] = fuseops::fused_add_rms_norm_forward(x, residual, w, 1e-6);
      EXPECT_TRUE(at::equal(out2, out));
      EXPECT_TRUE(at::equal(new_res2, new_residual));
      auto [grad_sum, grad_w] =
          fuseops::fused_add_rms_norm_backward(grad_out, grad_res, new_residual, w, rstd);
      const at::Tensor sd = as_double_leaf(new_residual);
      const at::Tensor wd = as_double_leaf(w);
      composite(sd, wd, 1e-6).backward(grad_out.to(at::kDouble));
      if (x.numel() > 0) {
        expect_close(grad_sum, (sd.grad() + grad_res.to(at::kDouble)).to(dtype), dtype);
      }
      // Without a gradient for new_residual, only the norm's part remains.
      auto [grad_norm_only, unused] =
          fuseops::fused_add_rms_norm_backward(grad_out, std::nullopt, new_residual, w, rstd);
      auto [grad_plain, unused2] = fuseops::rms_norm_backward(grad_out, new_residual, w, rstd);
      EXPECT_TRUE(at::equal(grad_norm_only, grad_plain));
    }
  }
}

TEST_P(RmsNorm, NonContiguousInputs) {
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(testing::Message() << dtype);
    const at::Tensor base = at::randn({40, 70}, options(dtype));
    const at::Tensor w_base = at::randn({80}, options(dtype));
    const at::Tensor w = w_base.slice(0, 0, 80, 2);  // strided, 40 elements
    const at::Tensor x = base.t();                   // (70, 40), strided
    ASSERT_FALSE(x.is_contiguous());
    expect_close(fuseops::rms_norm(x, w, 1e-6),
                 fuseops::rms_norm(x.contiguous(), w.contiguous(), 1e-6), dtype);
    const at::Tensor residual = at::randn({70, 80}, options(dtype)).slice(1, 0, 80, 2);
    auto [out, new_residual] = fuseops::fused_add_rms_norm(x, residual, w, 1e-6);
    auto [out_c, new_residual_c] =
        fuseops::fused_add_rms_norm(x.contiguous(), residual.contiguous(), w.contiguous(), 1e-6);
    EXPECT_TRUE(at::equal(out, out_c));
    EXPECT_TRUE(at::equal(new_residual, new_residual_c));
    const at::Tensor grad = at::randn({40, 70}, options(dtype)).t();
    auto [_, rstd] = fuseops::rms_norm_forward(x, w, 1e-6);
    auto [gx, gw] = fuseops::rms_norm_backward(grad, x, w, rstd);
    auto [gx_c, gw_c] =
        fuseops::rms_norm_backward(grad.contiguous(), x.contiguous(), w.contiguous(), rstd);
    EXPECT_TRUE(at::equal(gx, gx_c));
    EXPECT_TRUE(at::equal(gw, gw_c));
  }
}

TEST_P(RmsNorm, WeightOfAnotherDtype) {
  // As F.rms_norm: the weight may be float32 for a bfloat16 input; the result
  // has input's dtype and the weight gradient has weight's.
  const at::Tensor x = at::randn({6, 24}, options(at::kBFloat16)).requires_grad_();
  const at::Tensor w = at::randn({24}, options()).requires_grad_();
  const at::Tensor y = fuseops::rms_norm(x, w, 1e-6);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  expect_close(
      y, composite(x.detach().to(at::kDouble), w.detach().to(at::kDouble), 1e-6).to(at::kBFloat16),
      at::kBFloat16);
  y.backward(at::ones_like(y));
  EXPECT_EQ(x.grad().scalar_type(), at::kBFloat16);
  EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
}

TEST_P(RmsNorm, NanAndInfPropagateAsInPyTorch) {
  at::Tensor x = at::randn({3, 20}, options());
  x[0][3] = std::numeric_limits<float>::quiet_NaN();
  x[1][5] = std::numeric_limits<float>::infinity();
  const at::Tensor w = at::randn({20}, options());
  const at::Tensor y = fuseops::rms_norm(x, w, 1e-6);
  const at::Tensor expected = at::rms_norm(x, {20}, w, 1e-6);
  EXPECT_TRUE(at::equal(y.isnan(), expected.isnan()));
  EXPECT_TRUE(at::allclose(y.nan_to_num(0), expected.nan_to_num(0), 1e-5, 1e-6));
  EXPECT_TRUE(y[0].isnan().all().item<bool>());
  EXPECT_TRUE(at::allclose(y[2], expected[2], 1e-5, 1e-6));
}

TEST_P(RmsNorm, AutogradInCpp) {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    SCOPED_TRACE(testing::Message() << dtype);
    const at::Tensor x = at::randn({13, 29}, options(dtype)).requires_grad_();
    const at::Tensor w = at::randn({29}, options(dtype)).requires_grad_();
    const at::Tensor y = fuseops::rms_norm(x, w, 1e-5);
    ASSERT_TRUE(y.requires_grad());
    const at::Tensor upstream = at::randn_like(y);
    y.backward(upstream);
    const at::Tensor xd = as_double_leaf(x);
    const at::Tensor wd = as_double_leaf(w);
    composite(xd, wd, 1e-5).backward(upstream.to(at::kDouble));
    expect_close(x.grad(), xd.grad().to(dtype), dtype);
    expect_close(w.grad(), wd.grad().to(dtype), dtype);
  }
}

TEST_P(FusedAddRmsNorm, AutogradInCpp) {
  const at::Tensor x = at::randn({9, 40}, options()).requires_grad_();
  const at::Tensor r = at::randn({9, 40}, options()).requires_grad_();
  const at::Tensor w = at::randn({40}, options()).requires_grad_();
  auto [out, new_residual] = fuseops::fused_add_rms_norm(x, r, w, 1e-5);
  const at::Tensor g_out = at::randn({9, 40}, options());
  const at::Tensor g_res = at::randn({9, 40}, options());
  torch::autograd::backward({out, new_residual}, {g_out, g_res});

  const at::Tensor xd = as_double_leaf(x);
  const at::Tensor rd = as_double_leaf(r);
  const at::Tensor wd = as_double_leaf(w);
  const at::Tensor sum = xd + rd;
  torch::autograd::backward({composite(sum, wd, 1e-5), sum},
                            {g_out.to(at::kDouble), g_res.to(at::kDouble)});
  expect_close(x.grad(), xd.grad().to(at::kFloat), at::kFloat);
  expect_close(r.grad(), rd.grad().to(at::kFloat), at::kFloat);
  expect_close(w.grad(), wd.grad().to(at::kFloat), at::kFloat);
  // The two gradients are equal but must not share memory.
  EXPECT_NE(x.grad().data_ptr(), r.grad().data_ptr());
}

TEST_P(RmsNorm, DoubleBackward) {
  const at::Tensor x = at::randn({5, 12}, options(at::kDouble)).requires_grad_();
  const at::Tensor w = at::randn({12}, options(at::kDouble)).requires_grad_();
  const at::Tensor upstream = at::randn({5, 12}, options(at::kDouble));
  const auto first = torch::autograd::grad({fuseops::rms_norm(x, w, 1e-5)}, {x, w}, {upstream},
                                           /*retain_graph=*/true, /*create_graph=*/true);
  const auto second = torch::autograd::grad({first[0].sum() + first[1].sum()}, {x, w});

  const at::Tensor xd = x.detach().clone().requires_grad_();
  const at::Tensor wd = w.detach().clone().requires_grad_();
  const auto first_ref =
      torch::autograd::grad({composite(xd, wd, 1e-5)}, {xd, wd}, {upstream}, true, true);
  const auto second_ref =
      torch::autograd::grad({first_ref[0].sum() + first_ref[1].sum()}, {xd, wd});
  expect_close(second[0], second_ref[0], at::kDouble);
  expect_close(second[1], second_ref[1], at::kDouble);
}

TEST_P(RmsNorm, OutVariants) {
  const at::Tensor x = at::randn({6, 10}, options());
  const at::Tensor w = at::randn({10}, options());
  const at::Tensor expected = fuseops::rms_norm(x, w, 1e-6);
  at::Tensor out = at::empty({6, 10}, options());
  at::Tensor& returned = fuseops::rms_norm_out(x, w, 1e-6, out);
  EXPECT_EQ(returned.data_ptr(), out.data_ptr());
  EXPECT_TRUE(at::equal(out, expected));

  at::Tensor strided_out = at::empty({10, 6}, options()).t();
  fuseops::rms_norm_out(x, w, 1e-6, strided_out);
  EXPECT_FALSE(strided_out.is_contiguous());
  EXPECT_TRUE(at::equal(strided_out, expected));

  at::Tensor small = at::empty({0}, options());
  fuseops::rms_norm_out(x, w, 1e-6, small);
  EXPECT_TRUE(at::equal(small, expected));

  at::Tensor in_place = x.clone();
  fuseops::rms_norm_out(in_place, w, 1e-6, in_place);
  EXPECT_TRUE(at::equal(in_place, expected));

  // Partial overlap: out starts one row after input in the same buffer.
  at::Tensor buffer = at::randn({7, 10}, options());
  const at::Tensor shifted_expected = fuseops::rms_norm(buffer.slice(0, 0, 6), w, 1e-6);
  at::Tensor shifted_out = buffer.slice(0, 1, 7);
  fuseops::rms_norm_out(buffer.slice(0, 0, 6), w, 1e-6, shifted_out);
  EXPECT_TRUE(at::equal(shifted_out, shifted_expected));
}

TEST_P(FusedAddRmsNorm, OutVariantsIncludingInPlace) {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(testing::Message() << dtype);
    const at::Tensor x = at::randn({6, 50}, options(dtype));
    const at::Tensor r = at::randn({6, 50}, options(dtype));
    const at::Tensor w = at::randn({50}, options(dtype));
    auto [expected_out, expected_res] = fuseops::fused_add_rms_norm(x, r, w, 1e-6);

    at::Tensor out = at::empty({6, 50}, options(dtype));
    at::Tensor res_out = at::empty({0}, options(dtype));
    fuseops::fused_add_rms_norm_out(x, r, w, 1e-6, out, res_out);
    EXPECT_TRUE(at::equal(out, expected_out));
    EXPECT_TRUE(at::equal(res_out, expected_res));

    // The inference-engine layout: the norm overwrites the input and the
    // residual stream is updated in place.
    at::Tensor x_buf = x.clone();
    at::Tensor r_buf = r.clone();
    fuseops::fused_add_rms_norm_out(x_buf, r_buf, w, 1e-6, x_buf, r_buf);
    EXPECT_TRUE(at::equal(x_buf, expected_out));
    EXPECT_TRUE(at::equal(r_buf, expected_res));

    // Swapped roles: the sum overwrites the input, the norm the residual.
    x_buf = x.clone();
    r_buf = r.clone();
    fuseops::fused_add_rms_norm_out(x_buf, r_buf, w, 1e-6, r_buf, x_buf);
    EXPECT_TRUE(at::equal(r_buf, expected_out));
    EXPECT_TRUE(at::equal(x_buf, expected_res));

    at::Tensor strided_out = at::empty({50, 6}, options(dtype)).t();
    at::Tensor strided_res = at::empty({50, 6}, options(dtype)).t();
    fuseops::fused_add_rms_norm_out(x, r, w, 1e-6, strided_out, strided_res);
    EXPECT_TRUE(at::equal(strided_out, expected_out));
    EXPECT_TRUE(at::equal(strided_res, expected_res));
  }
}

TEST(RmsNorm, BadInputErrorsNameOpAndArgument) {
  expect_error_mentions([] { fuseops::rms_norm(at::ones({3}, at::kInt)); },
                        {"fuseops::rms_norm", "'input'", "Int"});
  expect_error_mentions([] { fuseops::rms_norm(at::Tensor()); },
                        {"fuseops::rms_norm", "'input'", "undefined"});
  expect_error_mentions([] { fuseops::rms_norm(at::ones({})); },
                        {"fuseops::rms_norm", "'input'", "0-dimensional"});
  expect_error_mentions([] { fuseops::rms_norm(at::ones({2, 3}), at::ones({4})); },
                        {"fuseops::rms_norm", "'weight'", "[3]", "[4]"});
  expect_error_mentions([] { fuseops::rms_norm(at::ones({2, 3}), at::ones({3}, at::kInt)); },
                        {"fuseops::rms_norm", "'weight'", "Int"});
  expect_error_mentions([] { fuseops::fused_add_rms_norm(at::ones({2, 3}), at::ones({2, 4})); },
                        {"fuseops::fused_add_rms_norm", "'residual'", "shape"});
  expect_error_mentions(
      [] { fuseops::fused_add_rms_norm(at::ones({2, 3}), at::ones({2, 3}, at::kDouble)); },
      {"fuseops::fused_add_rms_norm", "'residual'", "dtype"});
  expect_error_mentions(
      [] {
        fuseops::rms_norm_backward(at::ones({2, 3}), at::ones({2, 3}), std::nullopt,
                                   at::ones({2}, at::kDouble));
      },
      {"fuseops::rms_norm_backward", "'rstd'", "dtype"});
  expect_error_mentions(
      [] {
        fuseops::rms_norm_backward(at::ones({2, 3}), at::ones({2, 3}), std::nullopt, at::ones({3}));
      },
      {"fuseops::rms_norm_backward", "'rstd'", "shape"});
  expect_error_mentions(
      [] {
        fuseops::rms_norm_backward(at::ones({2, 4}), at::ones({2, 3}), std::nullopt, at::ones({2}));
      },
      {"fuseops::rms_norm_backward", "'grad_output'", "shape"});
  expect_error_mentions(
      [] {
        at::Tensor out = at::empty({2, 3}, at::kDouble);
        fuseops::rms_norm_out(at::ones({2, 3}), std::nullopt, std::nullopt, out);
      },
      {"fuseops::rms_norm.out", "'out'", "dtype"});
  expect_error_mentions(
      [] {
        at::Tensor out = at::empty({2, 3});
        at::Tensor res = at::empty({2, 3}, at::kHalf);
        fuseops::fused_add_rms_norm_out(at::ones({2, 3}), at::ones({2, 3}), std::nullopt,
                                        std::nullopt, out, res);
      },
      {"fuseops::fused_add_rms_norm.out", "'residual_out'", "dtype"});
}

TEST(RmsNorm, MetaTensorsGiveShapesOnly) {
  const auto meta = at::TensorOptions().device(at::kMeta).dtype(at::kBFloat16);
  const at::Tensor x = at::empty({4, 5}, meta);
  const at::Tensor w = at::empty({5}, meta);
  auto [y, rstd] = fuseops::rms_norm_forward(x, w);
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.sizes(), x.sizes());
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_EQ(rstd.sizes(), at::IntArrayRef({4}));
  EXPECT_EQ(rstd.scalar_type(), at::kFloat);
  auto [gx, gw] = fuseops::rms_norm_backward(y, x, w, rstd);
  EXPECT_EQ(gx.sizes(), x.sizes());
  EXPECT_EQ(gw.sizes(), w.sizes());
  auto [out, new_residual] = fuseops::fused_add_rms_norm(x, x, w);
  EXPECT_TRUE(out.is_meta() && new_residual.is_meta());
  EXPECT_EQ(new_residual.sizes(), x.sizes());
}

TEST_P(RmsNorm, EveryCpuBuildMatches) {
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    for (auto dtype : kDtypes) {
      SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype);
      // 1000 rows of 1027: several tasks per thread, a tail in every row.
      const at::Tensor x = at::randn({1000, 1027}, options(dtype));
      const at::Tensor r = at::randn({1000, 1027}, options(dtype));
      const at::Tensor w = at::randn({1027}, options(dtype));
      auto [out, new_residual, rstd] = fuseops::fused_add_rms_norm_forward(x, r, w, 1e-6);
      EXPECT_TRUE(at::equal(new_residual, x + r));
      expect_close(out, composite(new_residual.to(at::kDouble), w.to(at::kDouble), 1e-6).to(dtype),
                   dtype);
      const at::Tensor grad = at::randn_like(x);
      auto [gx, gw] = fuseops::rms_norm_backward(grad, new_residual, w, rstd);
      const at::Tensor sd = as_double_leaf(new_residual);
      const at::Tensor wd = as_double_leaf(w);
      composite(sd, wd, 1e-6).backward(grad.to(at::kDouble));
      expect_close(gx, sd.grad().to(dtype), dtype);
      // The weight gradient sums 1000 rows: bound its error by the dtype's
      // relative tolerance times the sum of the magnitudes of the terms.
      const Tolerance tol = tolerance(dtype);
      const at::Tensor sd_hat = sd.detach() * (sd.detach().pow(2).mean(-1, true) + 1e-6).rsqrt();
      const at::Tensor magnitude = (grad.to(at::kDouble).abs() * sd_hat.abs()).sum(0);
      const at::Tensor error = (gw.to(at::kDouble) - wd.grad()).abs();
      EXPECT_TRUE((error <= magnitude * tol.rtol + tol.atol).all().item<bool>())
          << (error / magnitude).max().item<double>();
    }
  }
}

// The out= rule of ops/common/checks.h, through the C++ API.
TEST_P(RmsNorm, OutSharingAWeightOrAnotherOutput) {
  const at::Tensor x = at::randn({4, 8}, options(at::kDouble));
  const at::Tensor r = at::randn({4, 8}, options(at::kDouble));
  at::Tensor w = at::randn({8}, options(at::kDouble));
  const at::Tensor w_before = w.clone();
  // Resizing `w` into the output would change the weight before it is read.
  expect_error_mentions([&] { fuseops::rms_norm_out(x, w, 1e-6, w); },
                        {"fuseops::rms_norm.out", "'out'", "'weight'"});
  EXPECT_TRUE(at::equal(w, w_before));
  at::Tensor o = at::empty({4, 8}, options(at::kDouble));
  expect_error_mentions([&] { fuseops::fused_add_rms_norm_out(x, r, w, 1e-6, o, o); },
                        {"fuseops::fused_add_rms_norm.out", "'out'", "'residual_out'"});
  // Rows 1..4 of a buffer whose row 0 is the weight: computed as if the
  // weight had been copied first.
  at::Tensor buffer = at::randn({5, 8}, options(at::kDouble));
  const at::Tensor weight_row = buffer[0];
  const at::Tensor expected = composite(x, weight_row.clone(), 1e-6);
  at::Tensor out = buffer.slice(0, 0, 4);
  fuseops::rms_norm_out(x, weight_row, 1e-6, out);
  expect_close(out, expected, at::kDouble);
}

TEST(RmsNorm, BackwardOpsRefuseToRecordAGradient) {
  const at::Tensor x = at::randn({3, 8}, at::kDouble).requires_grad_();
  const at::Tensor g = at::randn({3, 8}, at::kDouble);
  const at::Tensor rstd = std::get<1>(fuseops::rms_norm_forward(x.detach(), {}, 1e-6));
  expect_error_mentions([&] { fuseops::rms_norm_backward(g, x, {}, rstd); },
                        {"fuseops::rms_norm_backward", "not differentiable"});
  expect_error_mentions([&] { fuseops::fused_add_rms_norm_backward(g, {}, x, {}, rstd); },
                        {"fuseops::fused_add_rms_norm_backward", "not differentiable"});
}

TEST(RmsNorm, HiddenSizeZeroWithWeightUnderCreateGraph) {
  const at::Tensor x = at::randn({3, 0}, at::kDouble).requires_grad_();
  const at::Tensor w = at::randn({0}, at::kDouble).requires_grad_();
  const auto grads = torch::autograd::grad({fuseops::rms_norm(x, w, 1e-6).sum()}, {x, w}, {},
                                           /*retain_graph=*/true, /*create_graph=*/true);
  EXPECT_EQ(grads[0].sizes(), x.sizes());
  EXPECT_EQ(grads[1].sizes(), w.sizes());
}

// Called from many threads at once by threads_test.cpp.
// The backward's weight gradient sums over rows.
FUSEOPS_THREADS_CASE(rms_norm) {
  auto [y, rstd] = fuseops::rms_norm_forward(in.x, in.w, 1e-6);
  auto [grad_x, grad_w] = fuseops::rms_norm_backward(in.g, in.x, in.w, rstd);
  return {fuseops::rms_norm(in.x, in.w, 1e-6), y, rstd, grad_x, grad_w};
}

}  // namespace
