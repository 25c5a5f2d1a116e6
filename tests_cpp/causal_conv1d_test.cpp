// fuseops::causal_conv1d (forward, backward, final states) and
// causal_conv1d_update through the dispatcher, against an ATen composite
// (at::conv1d with groups = dim over the padded sequence, SiLU) computed in
// float64, in every compiled CPU build.
//
// Tolerances: every output sums at most 4 products (the weight gradient one
// per (batch, time) row), so float32/float64 are within 1e-5 of the float64
// composite (relative and absolute, values O(1); weight gradients scaled by
// sqrt(rows)); bfloat16/float16 results are the float32 result rounded once:
// one rounding step of the composite rounded to the dtype, 1e-2 / 2e-3.

#include <cmath>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include <fuseops/fuseops.h>

#include "test_helpers.h"

#include "ops/cpu/dispatch.h"

namespace {

using fuseops::testing::expect_error_mentions;
using fuseops::testing::kDtypes;
using fuseops::testing::reduction_tolerance;

class CausalConv1d : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(CausalConv1d);

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

std::optional<at::Tensor> opt(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// The composite, in float64: (out, final_states).
std::pair<at::Tensor, at::Tensor> composite(const at::Tensor& x, const at::Tensor& w,
                                            const at::Tensor& b, const at::Tensor& init,
                                            bool silu) {
  const int64_t width = w.size(1);
  const at::Tensor xd = x.to(at::kDouble);
  const at::Tensor states = init.defined()
                                ? init.to(at::kDouble)
                                : at::zeros({x.size(0), x.size(1), width - 1}, xd.options());
  const at::Tensor padded = at::cat({states, xd}, 2);
  at::Tensor out = at::conv1d(padded, w.to(at::kDouble).unsqueeze(1),
                              b.defined() ? b.to(at::kDouble) : at::Tensor(), at::IntArrayRef{1},
                              at::IntArrayRef{0}, at::IntArrayRef{1}, x.size(1));
  if (silu) {
    out = at::silu(out);
  }
  const int64_t total = padded.size(2);
  return {out, padded.narrow(2, total - (width - 1), width - 1)};
}

// x in one of the layouts the kernels read in place, or a strided one.
at::Tensor make_x(int64_t batch, int64_t dim, int64_t seqlen, const at::TensorOptions& options,
                  int layout) {
  switch (layout) {
    case 0:
      return at::randn({batch, dim, seqlen}, options);
    case 1:  // channel-last
      return at::randn({batch, seqlen, dim}, options).transpose(1, 2);
    case 2:  // channel-last, rows of a wider tensor (Mamba's x split from xBC)
      return at::randn({batch, seqlen, dim + 5}, options).narrow(2, 2, dim).transpose(1, 2);
    default:  // every other time step: copied
      return at::randn({batch, dim, 2 * seqlen}, options).slice(2, 0, 2 * seqlen, 2);
  }
}

struct Config {
  int64_t batch, dim, seqlen, width;
  bool bias, init, silu;
  int layout;
};

void check_config(const Config& cfg, const at::TensorOptions& options) {
  const at::ScalarType dtype = options.dtype().toScalarType();
  SCOPED_TRACE(testing::Message() << dtype << " b" << cfg.batch << " d" << cfg.dim << " l"
                                  << cfg.seqlen << " w" << cfg.width << " bias" << cfg.bias
                                  << " init" << cfg.init << " silu" << cfg.silu << " layout"
                                  << cfg.layout);
  const at::Tensor x = make_x(cfg.batch, cfg.dim, cfg.seqlen, options, cfg.layout);
  const at::Tensor w = at::randn({cfg.dim, cfg.width}, options) * 0.5;
  const at::Tensor b = cfg.bias ? at::randn({cfg.dim}, options) : at::Tensor();
  const at::Tensor init =
      cfg.init ? at::randn({cfg.batch, cfg.dim, cfg.width - 1}, options) : at::Tensor();
  const std::optional<std::string_view> act =
      cfg.silu ? std::optional<std::string_view>("silu") : std::nullopt;

  const auto [want_out, want_final] = composite(x, w, b, init, cfg.silu);
  const auto [out, final_states] = fuseops::causal_conv1d_forward(x, w, opt(b), opt(init), act);
  expect_close(out, want_out, dtype);
  expect_close(final_states, want_final, dtype);
  expect_close(fuseops::causal_conv1d(x, w, opt(b), opt(init), act), want_out, dtype);

  // Backward, final states' gradient included, against float64 autograd.
  const at::Tensor dy = at::randn(x.sizes(), options);
  const at::Tensor dfinal = at::randn({cfg.batch, cfg.dim, cfg.width - 1}, options);
  const auto [dx, dw, db, dinit] =
      fuseops::causal_conv1d_backward(dy, x, w, opt(b), opt(init), dfinal, act);
  const at::Tensor xd = x.to(at::kDouble).requires_grad_();
  const at::Tensor wd = w.to(at::kDouble).requires_grad_();
  const auto f64 = options.dtype(at::kDouble);
  const at::Tensor bd = at::zeros({cfg.dim}, f64).requires_grad_();
  const at::Tensor initd =
      (cfg.init ? init.to(at::kDouble) : at::zeros({cfg.batch, cfg.dim, cfg.width - 1}, f64))
          .requires_grad_();
  const at::Tensor bias_d = cfg.bias ? bd + b.to(at::kDouble) : bd;
  const auto [o, f] = composite(xd, wd, bias_d, initd, cfg.silu);
  const auto grads = torch::autograd::grad({o, f}, {xd, wd, bd, initd},
                                           {dy.to(at::kDouble), dfinal.to(at::kDouble)});
  expect_close(dx, grads[0], dtype);
  const double rows = std::sqrt(static_cast<double>(std::max<int64_t>(1, cfg.batch * cfg.seqlen)));
  expect_close(dw, grads[1], dtype, rows);
  expect_close(db, grads[2], dtype, rows);
  expect_close(dinit, grads[3], dtype);
}

TEST_P(CausalConv1d, ForwardAndBackwardMatchCompositeInEveryCpuBuild) {
  // Rows shorter than a vector, vector tails, several tasks per thread (the
  // channel-last chunks are 128 steps of up to 4096 channels), sequences
  // shorter than the width.
  const std::vector<Config> configs = {
      {2, 3, 1, 4, true, true, true, 0},     {1, 5, 2, 3, false, true, false, 1},
      {2, 7, 3, 2, true, false, true, 2},    {3, 33, 37, 4, true, true, true, 0},
      {2, 33, 37, 4, true, true, true, 1},   {2, 19, 70, 3, false, false, true, 2},
      {2, 6, 45, 4, true, true, false, 3},   {2, 1030, 300, 4, true, true, true, 1},
      {3, 40, 1000, 4, true, true, true, 0}, {1, 2, 5, 2, false, true, true, 1},
      {2, 4100, 9, 3, true, true, true, 2},
  };
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    SCOPED_TRACE(fuseops::cpu::capability_name(capability));
    for (auto dtype : kDtypes) {
      for (const Config& cfg : configs) {
        check_config(cfg, options(dtype));
      }
    }
  }
}

TEST_P(CausalConv1d, ChannelLastInputIsReadInPlaceAndKeepsItsLayout) {
  const at::Tensor x =
      at::randn({2, 64, 16}, options()).transpose(1, 2).contiguous().transpose(1, 2);
  const at::Tensor w = at::randn({64, 4}, options());
  const at::Tensor out = fuseops::causal_conv1d(x, w);
  EXPECT_EQ(out.strides(), x.strides());
  const at::Tensor rows = at::randn({2, 64, 16}, options());
  EXPECT_TRUE(fuseops::causal_conv1d(rows, w).is_contiguous());
}

TEST_P(CausalConv1d, AutogradInCpp) {
  const at::Tensor x = at::randn({2, 8, 20}, options(at::kDouble)).requires_grad_();
  const at::Tensor w = at::randn({8, 3}, options(at::kDouble)).requires_grad_();
  const at::Tensor b = at::randn({8}, options(at::kDouble)).requires_grad_();
  const at::Tensor init = at::randn({2, 8, 2}, options(at::kDouble)).requires_grad_();
  auto [out, final_states] = fuseops::causal_conv1d_forward(x, w, b, init, "silu");
  (out.sin().sum() + final_states.cos().sum()).backward();
  const at::Tensor x2 = x.detach().clone().requires_grad_();
  const at::Tensor w2 = w.detach().clone().requires_grad_();
  const at::Tensor b2 = b.detach().clone().requires_grad_();
  const at::Tensor init2 = init.detach().clone().requires_grad_();
  auto [o, f] = composite(x2, w2, b2, init2, true);
  (o.sin().sum() + f.cos().sum()).backward();
  for (const auto& [got, want] : {std::pair{x, x2}, {w, w2}, {b, b2}, {init, init2}}) {
    EXPECT_TRUE(at::allclose(got.grad(), want.grad(), 1e-10, 1e-12));
  }
}

TEST_P(CausalConv1d, Float32WeightWithBfloat16Input) {
  const at::Tensor x = at::randn({2, 16, 40}, options()).to(at::kBFloat16);
  const at::Tensor w = at::randn({16, 4}, options());
  const at::Tensor b = at::randn({16}, options());
  const at::Tensor out = fuseops::causal_conv1d(x, w, b, std::nullopt, "silu");
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  expect_close(out, composite(x, w, b, at::Tensor(), true).first, at::kBFloat16);
  const auto grads = fuseops::causal_conv1d_backward(at::ones_like(x), x, w, b, std::nullopt,
                                                     std::nullopt, "silu");
  EXPECT_EQ(std::get<1>(grads).scalar_type(), at::kFloat);
  EXPECT_EQ(std::get<2>(grads).scalar_type(), at::kFloat);
}

TEST_P(CausalConv1d, WeightGradientIsDeterministic) {
  const at::Tensor x =
      at::randn({4, 300, 700}, options()).transpose(1, 2).contiguous().transpose(1, 2);
  const at::Tensor w = at::randn({300, 4}, options());
  const at::Tensor dy =
      at::randn(x.sizes(), options()).transpose(1, 2).contiguous().transpose(1, 2);
  const auto first =
      fuseops::causal_conv1d_backward(dy, x, w, std::nullopt, std::nullopt, std::nullopt, "silu");
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto second =
      fuseops::causal_conv1d_backward(dy, x, w, std::nullopt, std::nullopt, std::nullopt, "silu");
  at::set_num_threads(threads);
  EXPECT_TRUE(at::equal(std::get<1>(first), std::get<1>(second)));
  EXPECT_TRUE(at::equal(std::get<2>(first), std::get<2>(second)));
}

TEST_P(CausalConv1d, UpdateMatchesTheFullConvolutionTokenByToken) {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    for (int64_t width : {2, 3, 4}) {
      for (int64_t state_len : {width - 1, width + 2}) {
        SCOPED_TRACE(testing::Message() << dtype << " width " << width << " state " << state_len);
        const at::Tensor x = at::randn({2, 5, 9}, options(dtype));
        const at::Tensor w = at::randn({5, width}, options(dtype));
        const at::Tensor b = at::randn({5}, options(dtype));
        const at::Tensor full = composite(x, w, b, at::Tensor(), true).first;
        at::Tensor state = at::zeros({2, 5, state_len}, options(dtype));
        for (int64_t t = 0; t < 9; ++t) {
          const at::Tensor step =
              fuseops::causal_conv1d_update(x.select(2, t), state, w, b, "silu");
          ASSERT_EQ(step.sizes(), (std::vector<int64_t>{2, 5}));
          expect_close(step, full.select(2, t), dtype);
        }
        // The state holds the last state_len inputs.
        expect_close(state, x.narrow(2, 9 - state_len, state_len), dtype);
        // Several tokens at once continue the same sequence.
        at::Tensor state2 = at::zeros({2, 5, state_len}, options(dtype));
        const at::Tensor first =
            fuseops::causal_conv1d_update(x.narrow(2, 0, 4), state2, w, b, "silu");
        const at::Tensor rest =
            fuseops::causal_conv1d_update(x.narrow(2, 4, 5), state2, w, b, "silu");
        expect_close(at::cat({first, rest}, 2), full, dtype);
      }
    }
  }
}

TEST(CausalConv1d, BadInputErrorsNameOpAndArgument) {
  const at::Tensor x = at::randn({2, 4, 8});
  const at::Tensor w = at::randn({4, 4});
  expect_error_mentions([&] { fuseops::causal_conv1d(x, at::randn({4, 5})); },
                        {"fuseops::causal_conv1d", "'weight'", "2, 3 or 4", "got 5"});
  expect_error_mentions([&] { fuseops::causal_conv1d(x, at::randn({4, 1})); },
                        {"fuseops::causal_conv1d", "'weight'", "got 1"});
  expect_error_mentions([&] { fuseops::causal_conv1d(x, at::randn({3, 4})); },
                        {"fuseops::causal_conv1d", "'weight'", "(4, width)"});
  expect_error_mentions([&] { fuseops::causal_conv1d(x, w.to(at::kDouble)); },
                        {"fuseops::causal_conv1d", "'weight'", "dtype"});
  expect_error_mentions([&] { fuseops::causal_conv1d(x.select(0, 0), w); },
                        {"fuseops::causal_conv1d", "'x'", "3 dimensions"});
  expect_error_mentions([&] { fuseops::causal_conv1d(x, w, at::randn({5})); },
                        {"fuseops::causal_conv1d", "'bias'", "(4)"});
  expect_error_mentions([&] { fuseops::causal_conv1d(x, w, std::nullopt, at::randn({2, 4, 2})); },
                        {"fuseops::causal_conv1d", "'initial_states'", "(2, 4, 3)"});
  expect_error_mentions([&] { fuseops::causal_conv1d(x, w, std::nullopt, std::nullopt, "relu"); },
                        {"fuseops::causal_conv1d", "'activation'", "'relu'"});
  expect_error_mentions([&] { fuseops::causal_conv1d(x.to(at::kInt), w); },
                        {"fuseops::causal_conv1d", "'x'", "dtype"});
  at::Tensor state = at::zeros({2, 4, 2});
  expect_error_mentions(
      [&] { fuseops::causal_conv1d_update(x, state, w); },
      {"fuseops::causal_conv1d_update", "'conv_state'", "state_len >= width - 1"});
  at::Tensor buffer = at::zeros({2, 4, 8});
  at::Tensor aliased_state = buffer.narrow(2, 0, 4);
  expect_error_mentions(
      [&] { fuseops::causal_conv1d_update(buffer.narrow(2, 4, 1), aliased_state, w); },
      {"fuseops::causal_conv1d_update", "'x'", "'conv_state'"});
  at::Tensor expanded = at::zeros({1, 4, 3}).expand({2, 4, 3});
  expect_error_mentions([&] { fuseops::causal_conv1d_update(x.select(2, 0), expanded, w); },
                        {"fuseops::causal_conv1d_update", "'conv_state'", "share memory"});
}

TEST(CausalConv1d, DoubleBackwardAndUpdateUnderGradAreClearErrors) {
  const at::Tensor x = at::randn({1, 4, 6}, at::kDouble).requires_grad_();
  const at::Tensor w = at::randn({4, 3}, at::kDouble).requires_grad_();
  const at::Tensor out = fuseops::causal_conv1d(x, w, std::nullopt, std::nullopt, "silu");
  expect_error_mentions(
      [&] {
        auto g = torch::autograd::grad({out.sum()}, {x}, {}, std::nullopt, /*create_graph=*/true);
      },
      {"fuseops::causal_conv1d_backward", "not differentiable"});
  at::Tensor state = at::zeros({1, 4, 2}, at::kDouble);
  expect_error_mentions([&] { fuseops::causal_conv1d_update(x.detach().select(2, 0), state, w); },
                        {"fuseops::causal_conv1d_update", "not differentiable"});
}

TEST_P(CausalConv1d, EmptyInputs) {
  for (const auto& shape : {std::vector<int64_t>{0, 4, 5}, {2, 0, 5}, {2, 4, 0}}) {
    const at::Tensor x = at::randn(shape, options());
    const at::Tensor w = at::randn({shape[1], 4}, options());
    const at::Tensor init = at::randn({shape[0], shape[1], 3}, options());
    const auto [out, final_states] = fuseops::causal_conv1d_forward(x, w, std::nullopt, init);
    EXPECT_EQ(out.sizes(), x.sizes());
    const at::Tensor joined = at::cat({init, x}, 2);
    EXPECT_TRUE(at::equal(final_states, joined.narrow(2, joined.size(2) - 3, 3)));
    const at::Tensor dfinal = at::randn({shape[0], shape[1], 3}, options());
    const auto [dx, dw, db, dinit] =
        fuseops::causal_conv1d_backward(x, x, w, std::nullopt, init, dfinal, std::nullopt);
    EXPECT_EQ(dx.sizes(), x.sizes());
    EXPECT_TRUE(at::equal(dw, at::zeros_like(w)));
    EXPECT_TRUE(at::equal(dinit, shape[2] == 0 ? dfinal : at::zeros_like(dfinal)));
  }
}

}  // namespace
