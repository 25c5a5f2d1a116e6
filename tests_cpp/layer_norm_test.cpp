// fuseops::layer_norm and layer_norm_backward through the dispatcher, against
// an ATen composite computed in float64, in every compiled CPU build.
//
// Tolerances: float32/float64 within 1e-5 (relative and absolute; values are
// O(1)) of the float64 composite, the float32 accumulation error over rows of
// a few thousand elements being ~1e-6. bfloat16/float16 results are the
// float32 result rounded once, so they must be within one rounding step of
// the float64 composite rounded to the dtype: 1e-2 (bfloat16, 8-bit
// mantissa) and 2e-3 (float16, 11-bit mantissa), relative and absolute.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <fuseops/fuseops.h>

#include "test_helpers.h"

#include "ops/cpu/dispatch.h"

namespace {

using fuseops::testing::expect_error_mentions;
using fuseops::testing::kDtypes;
using fuseops::testing::reduction_tolerance;

class LayerNorm : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(LayerNorm);

// Rows shorter than a vector, tails after full vectors, zero rows, several
// parallel chunks, and a row longer than a task's grain.
const std::vector<std::vector<int64_t>> kShapes = {{1},        {7},        {3, 17},   {5, 0, 33},
                                                   {2, 3, 64}, {37, 1000}, {300, 96}, {3, 20011}};

void expect_close(const at::Tensor& actual, const at::Tensor& expected, at::ScalarType dtype,
                  double scale = 1.0) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  ASSERT_EQ(actual.scalar_type(), dtype);
  const double tol = reduction_tolerance(dtype) * scale;
  const at::Tensor a = actual.to(at::kDouble);
  const at::Tensor e = expected.to(dtype).to(at::kDouble);
  EXPECT_TRUE(at::allclose(a, e, tol, tol, /*equal_nan=*/true))
      << "max abs diff " << (a - e).abs().nan_to_num(0).max().item<double>();
}

struct Composite {
  at::Tensor out, mean, rstd;
};

// The float64 reference: mean, biased variance, normalize, affine.
Composite composite_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                            double eps) {
  const at::Tensor xd = x.to(at::kDouble);
  const at::Tensor mean = xd.mean(-1, /*keepdim=*/true);
  const at::Tensor var = (xd - mean).pow(2).mean(-1, /*keepdim=*/true);
  const at::Tensor rstd = (var + eps).rsqrt();
  at::Tensor out = (xd - mean) * rstd;
  if (w.defined()) {
    out = out * w.to(at::kDouble);
  }
  if (b.defined()) {
    out = out + b.to(at::kDouble);
  }
  return {out, mean.squeeze(-1), rstd.squeeze(-1)};
}

std::vector<at::Tensor> composite_backward(const at::Tensor& dy, const at::Tensor& x,
                                           const at::Tensor& w, double eps) {
  const at::Tensor xd = x.to(at::kDouble).requires_grad_();
  const auto f64 = x.options().dtype(at::kDouble);
  const at::Tensor wd = w.defined() ? w.to(at::kDouble) : at::ones({x.size(-1)}, f64);
  const at::Tensor bd = at::zeros({x.size(-1)}, f64);
  wd.requires_grad_();
  bd.requires_grad_();
  const at::Tensor out = composite_forward(xd, wd, bd, eps).out;
  return torch::autograd::grad({out}, {xd, wd, bd}, {dy.to(at::kDouble)});
}

at::Tensor maybe(bool present, at::IntArrayRef shape, const at::TensorOptions& options) {
  return present ? at::randn(shape, options) : at::Tensor();
}

std::optional<at::Tensor> opt(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

void check_forward_and_backward(const at::Tensor& x, at::ScalarType dtype, bool with_weight,
                                bool with_bias) {
  const int64_t hidden = x.size(-1);
  const at::Tensor w = maybe(with_weight, {hidden}, x.options().dtype(dtype));
  const at::Tensor b = maybe(with_bias, {hidden}, x.options().dtype(dtype));
  const double eps = 1e-5;
  const Composite expected = composite_forward(x, w, b, eps);
  expect_close(fuseops::layer_norm(x, opt(w), opt(b), eps), expected.out, dtype);

  const at::Tensor dy = at::randn(x.sizes(), x.options());
  const auto stats_dtype = dtype == at::kDouble ? at::kDouble : at::kFloat;
  const auto [dx, dw, db] = fuseops::layer_norm_backward(
      dy, x, opt(w), expected.mean.to(stats_dtype), expected.rstd.to(stats_dtype));
  const auto grads = composite_backward(dy, x, w, eps);
  expect_close(dx, grads[0], dtype);
  // The parameter gradients are sums over all rows: their error grows with
  // the row count; scale the tolerance by sqrt(rows).
  const double rows_factor =
      std::sqrt(std::max<double>(1.0, x.numel() / std::max<int64_t>(hidden, 1)));
  const double tol = reduction_tolerance(dtype) * rows_factor;
  EXPECT_TRUE(at::allclose(dw.to(at::kDouble), grads[1], tol, tol));
  EXPECT_TRUE(at::allclose(db.to(at::kDouble), grads[2], tol, tol));
}

TEST_P(LayerNorm, ForwardAndBackwardMatchCompositeInEveryCpuBuild) {
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    for (auto dtype : kDtypes) {
      for (const auto& shape : kShapes) {
        for (int affine = 0; affine < 4; ++affine) {
          SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " "
                                          << dtype << " " << at::IntArrayRef(shape) << " weight="
                                          << (affine & 1) << " bias=" << (affine >> 1));
          const at::Tensor x = at::randn(shape, options(dtype)) * 3 + 1;
          check_forward_and_backward(x, dtype, affine & 1, affine >> 1);
        }
      }
    }
  }
}

TEST_P(LayerNorm, NonContiguousInputs) {
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(testing::Message() << dtype);
    const at::Tensor base = at::randn({40, 70}, options(dtype));
    for (const auto& x : {base.t(), base.slice(1, 1, 70, 3), base.select(0, 0).expand({5, 70})}) {
      ASSERT_FALSE(x.is_contiguous());
      check_forward_and_backward(x, dtype, true, true);
    }
  }
}

TEST_P(LayerNorm, StatisticsAreFloat32MeanAndRstd) {
  const at::Tensor x = at::randn({6, 50}, options(at::kBFloat16));
  const auto [out, mean, rstd] = fuseops::layer_norm_forward(x);
  EXPECT_EQ(mean.scalar_type(), at::kFloat);
  EXPECT_EQ(mean.sizes(), at::IntArrayRef({6}));
  const Composite expected = composite_forward(x, at::Tensor(), at::Tensor(), 1e-5);
  EXPECT_TRUE(at::allclose(mean.to(at::kDouble), expected.mean, 1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(rstd.to(at::kDouble), expected.rstd, 1e-5, 1e-5));
  EXPECT_TRUE(at::equal(out, fuseops::layer_norm(x)));
}

// What code with its own autograd does: keep (mean, rstd) from
// layer_norm_forward and hand them to layer_norm_backward.
TEST_P(LayerNorm, ForwardStatisticsFeedBackwardLikeAutograd) {
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(testing::Message() << dtype);
    const at::Tensor x = (at::randn({5, 3, 70}, options(dtype)) * 3 + 1).requires_grad_();
    const at::Tensor w = at::randn({70}, options(dtype)).requires_grad_();
    const at::Tensor b = at::randn({70}, options(dtype)).requires_grad_();
    const auto [out, mean, rstd] = fuseops::layer_norm_forward(x, w, b, 1e-5);
    EXPECT_TRUE(out.requires_grad());
    EXPECT_FALSE(mean.requires_grad());
    EXPECT_FALSE(rstd.requires_grad());
    EXPECT_EQ(mean.sizes(), at::IntArrayRef({5, 3}));
    EXPECT_TRUE(at::equal(out, fuseops::layer_norm(x, w, b, 1e-5)));
    const at::Tensor upstream = at::randn({5, 3, 70}, options(dtype));
    out.backward(upstream);

    const auto [dx, dw, db] =
        fuseops::layer_norm_backward(upstream, x.detach(), w.detach(), mean, rstd);
    EXPECT_TRUE(at::equal(dx, x.grad()));
    EXPECT_TRUE(at::equal(dw, w.grad()));
    EXPECT_TRUE(at::equal(db, b.grad()));
    const auto grads = composite_backward(upstream, x.detach(), w.detach(), 1e-5);
    expect_close(dx, grads[0], dtype);
    const double tol = reduction_tolerance(dtype) * std::sqrt(15.0);
    EXPECT_TRUE(at::allclose(dw.to(at::kDouble), grads[1], tol, tol));
    EXPECT_TRUE(at::allclose(db.to(at::kDouble), grads[2], tol, tol));
  }
}

// at::native_layer_norm keeps a trailing 1 in the statistics' shape and, on
// CPU, input's dtype. The backward takes them as they are; the reference is
// the exact backward in float64 from the same statistics (ATen's own
// bfloat16 backward rounds its weight-gradient sums differently by CPU).
TEST_P(LayerNorm, BackwardTakesNativeLayerNormStatistics) {
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(testing::Message() << dtype);
    const at::Tensor x = at::randn({4, 6, 40}, options(dtype)) * 3 + 1;
    const at::Tensor w = at::randn({40}, options(dtype));
    const at::Tensor b = at::randn({40}, options(dtype));
    const auto [out, mean, rstd] = at::native_layer_norm(x, {40}, w, b, 1e-5);
    ASSERT_EQ(mean.sizes(), at::IntArrayRef({4, 6, 1}));
    const at::Tensor dy = at::randn({4, 6, 40}, options(dtype));
    const auto [dx, dw, db] = fuseops::layer_norm_backward(dy, x, w, mean, rstd);
    const at::Tensor dyd = dy.to(at::kDouble);
    const at::Tensor rstd_d = rstd.to(at::kDouble);
    const at::Tensor xhat = (x.to(at::kDouble) - mean.to(at::kDouble)) * rstd_d;
    const at::Tensor g = dyd * w.to(at::kDouble);
    const at::Tensor want_dx = rstd_d * (g - g.mean(-1, true) - xhat * (g * xhat).mean(-1, true));
    const at::Tensor want_dw = (dyd * xhat).sum(at::IntArrayRef{0, 1});
    const at::Tensor want_db = dyd.sum(at::IntArrayRef{0, 1});
    const double tol = reduction_tolerance(dtype);
    const double sum_tol = tol * std::sqrt(24.0);
    EXPECT_TRUE(at::allclose(dx.to(at::kDouble), want_dx, tol, tol));
    EXPECT_TRUE(at::allclose(dw.to(at::kDouble), want_dw, sum_tol, sum_tol));
    EXPECT_TRUE(at::allclose(db.to(at::kDouble), want_db, sum_tol, sum_tol));
  }
}

TEST_P(LayerNorm, NanAndInfPropagateAsInATen) {
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(testing::Message() << dtype);
    at::Tensor x = at::randn({4, 40}, options(dtype));
    x[0][3] = std::numeric_limits<double>::quiet_NaN();
    x[1][5] = std::numeric_limits<double>::infinity();
    x[2][7] = -std::numeric_limits<double>::infinity();
    const at::Tensor y = fuseops::layer_norm(x);
    const at::Tensor expected = at::layer_norm(x, {40});
    EXPECT_TRUE(at::equal(y.isnan(), expected.isnan()));
    EXPECT_TRUE(at::equal(y.isinf(), expected.isinf()));
    EXPECT_TRUE(y[3].isfinite().all().item<bool>());
  }
}

TEST_P(LayerNorm, AutogradInCpp) {
  for (int affine = 0; affine < 4; ++affine) {
    SCOPED_TRACE(affine);
    const at::Tensor x = at::randn({13, 29}, options(at::kDouble)).requires_grad_();
    const at::Tensor w =
        (affine & 1) ? at::randn({29}, options(at::kDouble)).requires_grad_() : at::Tensor();
    const at::Tensor b =
        (affine >> 1) ? at::randn({29}, options(at::kDouble)).requires_grad_() : at::Tensor();
    const at::Tensor y = fuseops::layer_norm(x, opt(w), opt(b), 1e-5);
    ASSERT_TRUE(y.requires_grad());
    const at::Tensor upstream = at::randn_like(y);
    y.backward(upstream);

    const at::Tensor xr = x.detach().clone().requires_grad_();
    const at::Tensor wr = w.defined() ? w.detach().clone().requires_grad_() : at::Tensor();
    const at::Tensor br = b.defined() ? b.detach().clone().requires_grad_() : at::Tensor();
    at::layer_norm(xr, {29}, opt(wr), opt(br), 1e-5).backward(upstream);
    EXPECT_TRUE(at::allclose(x.grad(), xr.grad(), 1e-10, 1e-10));
    if (w.defined()) {
      EXPECT_TRUE(at::allclose(w.grad(), wr.grad(), 1e-10, 1e-10));
    }
    if (b.defined()) {
      EXPECT_TRUE(at::allclose(b.grad(), br.grad(), 1e-10, 1e-10));
    }
  }
}

TEST(LayerNorm, NoGradientsRecordedWithoutRequiresGrad) {
  const at::Tensor y = fuseops::layer_norm(at::randn({3, 8}));
  EXPECT_FALSE(y.requires_grad());
}

TEST_P(LayerNorm, OutVariant) {
  const at::Tensor x = at::randn({6, 10}, options());
  const at::Tensor w = at::randn({10}, options());
  const at::Tensor b = at::randn({10}, options());
  const at::Tensor expected = fuseops::layer_norm(x, w, b, 1e-5);

  at::Tensor out = at::empty({6, 10}, options());
  at::Tensor& returned = fuseops::layer_norm_out(x, w, b, 1e-5, out);
  EXPECT_EQ(returned.data_ptr(), out.data_ptr());
  EXPECT_TRUE(at::equal(out, expected));

  at::Tensor out_t = at::empty({10, 6}, options()).t();
  fuseops::layer_norm_out(x, w, b, 1e-5, out_t);
  EXPECT_FALSE(out_t.is_contiguous());
  EXPECT_TRUE(at::equal(out_t, expected));

  at::Tensor small = at::empty({0}, options());
  fuseops::layer_norm_out(x, w, b, 1e-5, small);
  EXPECT_TRUE(at::equal(small, expected));

  // In place: each row is read before it is written.
  at::Tensor y = x.clone();
  fuseops::layer_norm_out(y, w, b, 1e-5, y);
  EXPECT_TRUE(at::equal(y, expected));

  // Partial overlap: out starts one row after input in the same buffer.
  at::Tensor buffer = at::randn({7, 10}, options());
  const at::Tensor shifted_expected = fuseops::layer_norm(buffer.slice(0, 0, 6), w, b, 1e-5);
  at::Tensor shifted_out = buffer.slice(0, 1, 7);
  fuseops::layer_norm_out(buffer.slice(0, 0, 6), w, b, 1e-5, shifted_out);
  EXPECT_TRUE(at::equal(shifted_out, shifted_expected));
}

TEST_P(LayerNorm, ZeroRowsGiveZeroParameterGradients) {
  const at::Tensor x = at::randn({0, 12}, options());
  const auto [dx, dw, db] =
      fuseops::layer_norm_backward(at::randn({0, 12}, options()), x, at::randn({12}, options()),
                                   at::empty({0}, options()), at::empty({0}, options()));
  EXPECT_EQ(dx.sizes(), x.sizes());
  EXPECT_TRUE(at::equal(dw, at::zeros({12}, options())));
  EXPECT_TRUE(at::equal(db, at::zeros({12}, options())));
}

TEST(LayerNorm, BadInputErrorsNameOpAndArgument) {
  const at::Tensor x = at::randn({3, 8});
  expect_error_mentions([] { fuseops::layer_norm(at::ones({3}, at::kInt)); },
                        {"fuseops::layer_norm", "'input'", "Int"});
  expect_error_mentions([] { fuseops::layer_norm(at::Tensor()); },
                        {"fuseops::layer_norm", "'input'", "undefined"});
  expect_error_mentions([] { fuseops::layer_norm(at::scalar_tensor(1.0)); },
                        {"fuseops::layer_norm", "'input'", "0-dimensional"});
  expect_error_mentions([&] { fuseops::layer_norm(x, at::ones({7})); },
                        {"fuseops::layer_norm", "'weight'", "[8]", "[7]"});
  expect_error_mentions([&] { fuseops::layer_norm(x, std::nullopt, at::ones({8}, at::kDouble)); },
                        {"fuseops::layer_norm", "'bias'", "dtype", "Double"});
  expect_error_mentions([&] { fuseops::layer_norm(x, at::ones({2, 4})); },
                        {"fuseops::layer_norm", "'weight'", "shape"});
  expect_error_mentions(
      [&] {
        at::Tensor out = at::empty({3, 8}, at::kDouble);
        fuseops::layer_norm_out(x, std::nullopt, std::nullopt, 1e-5, out);
      },
      {"fuseops::layer_norm.out", "'out'", "dtype"});
  expect_error_mentions(
      [&] {
        fuseops::layer_norm_backward(at::ones({3, 7}), x, std::nullopt, at::ones({3}),
                                     at::ones({3}));
      },
      {"fuseops::layer_norm_backward", "'grad_output'", "shape"});
  expect_error_mentions(
      [&] {
        fuseops::layer_norm_backward(at::ones({3, 8}), x, std::nullopt, at::ones({3}, at::kInt),
                                     at::ones({3}));
      },
      {"fuseops::layer_norm_backward", "'mean'", "dtype", "Int"});
  expect_error_mentions(
      [&] {
        fuseops::layer_norm_backward(at::ones({3, 8}), x, std::nullopt, at::ones({3}),
                                     at::ones({4}));
      },
      {"fuseops::layer_norm_backward", "'rstd'", "shape [3]", "followed by 1", "[4]"});
  expect_error_mentions(
      [&] {
        fuseops::layer_norm_backward(at::ones({3, 8}), x, std::nullopt, at::ones({3, 2}),
                                     at::ones({3}));
      },
      {"fuseops::layer_norm_backward", "'mean'", "shape [3]", "[3, 2]"});
  expect_error_mentions([&] { fuseops::layer_norm_forward(x, at::ones({7})); },
                        {"fuseops::layer_norm_forward", "'weight'", "[8]", "[7]"});
}

TEST(LayerNorm, DoubleBackwardIsAClearError) {
  const at::Tensor x = at::randn({4, 6}, at::kDouble).requires_grad_();
  const at::Tensor y = fuseops::layer_norm(x);
  expect_error_mentions(
      [&] {
        torch::autograd::grad({y}, {x}, {at::randn_like(y)}, /*retain_graph=*/true,
                              /*create_graph=*/true);
      },
      {"fuseops::layer_norm_backward", "double backward"});
}

TEST(LayerNorm, MetaTensorsGiveShapesOnly) {
  const auto meta = at::TensorOptions().device(at::kMeta).dtype(at::kBFloat16);
  const at::Tensor x = at::empty({4, 5, 16}, meta);
  const at::Tensor y = fuseops::layer_norm(x, at::empty({16}, meta), at::empty({16}, meta));
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.sizes(), x.sizes());
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  const auto [dx, dw, db] =
      fuseops::layer_norm_backward(x, x, std::nullopt, at::empty({4, 5}, meta.dtype(at::kFloat)),
                                   at::empty({4, 5}, meta.dtype(at::kFloat)));
  EXPECT_EQ(dx.sizes(), x.sizes());
  EXPECT_EQ(dw.sizes(), at::IntArrayRef({16}));
  EXPECT_EQ(db.scalar_type(), at::kBFloat16);
}

// Rows where a naive float32 mean or variance fails, on every build:
// constant rows with BERT's eps = 1e-12 (the rounding of a plain float32
// mean is all of x - mean there, and 1 / sqrt(eps) = 1e6 magnifies it to
// |y| ~ 0.9), rows with an offset larger than their spread, and rows whose
// squared deviations overflow float32 (|x| ~ 1e30). Expected: the float64
// composite, within the module's tolerances; constant rows give exactly the
// bias.
TEST_P(LayerNorm, NumericallyHardRowsOnEveryBuild) {
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kDouble}) {
      const auto options = this->options(dtype);
      for (int64_t hidden : {1, 7, 4096, 100003}) {
        SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype
                                        << " hidden " << hidden);
        const at::Tensor b = at::randn({hidden}, options);
        const at::Tensor w = at::randn({hidden}, options);
        const at::Tensor constant = at::full({3, hidden}, 3.3, options);
        EXPECT_TRUE(at::equal(fuseops::layer_norm(constant, w, b, 1e-12), b.expand({3, hidden})));

        // An offset ten times the spread. The row's mean and variance are
        // float32 sums of `hidden` terms near 10 and 1: their rounding errors
        // add up like a random walk, growing as sqrt(hidden), and enter
        // every output through (x - mean) * rstd. reduction_tolerance holds
        // for sums of up to ~10^4 terms; longer rows scale it by
        // sqrt(hidden / 10^4): at hidden 100003 the bound is 3.2e-5 (1 +
        // |out|), where 40 seeds on every build measured up to 1.5e-5 (1 +
        // |out|) (1e-5 failed).
        const double sum_scale = std::sqrt(std::max(1.0, static_cast<double>(hidden) / 1e4));
        const at::Tensor offset = at::randn({3, hidden}, options) + 10;
        const at::Tensor huge = at::randn({3, hidden}, options) * 1e30;
        for (const at::Tensor& x : {offset, huge}) {
          SCOPED_TRACE(testing::Message() << "max |x| " << x.abs().max().item<double>());
          expect_close(fuseops::layer_norm(x, w, b, 1e-12), composite_forward(x, w, b, 1e-12).out,
                       dtype, sum_scale);
        }
      }
    }
  }
}

// Called from many threads at once by threads_test.cpp.
FUSEOPS_THREADS_CASE(layer_norm) { return {fuseops::layer_norm(in.x, in.w, in.w, 1e-5)}; }

}  // namespace
