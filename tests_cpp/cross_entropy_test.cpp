// fuseops::cross_entropy (forward, backward, the in-place variant) and
// fuseops::linear_cross_entropy through the dispatcher, against an ATen
// composite computed in float64, in every compiled CPU build.
//
// Tolerances: float32/float64 within 1e-5 relative + 1e-6 absolute of the
// float64 composite (float32 accumulation over rows of up to a few thousand
// classes errs by ~1e-6 relative). bfloat16/float16 take their inputs exactly
// (widened) and round the result once: within 1e-2 (bfloat16) and 2e-3
// (float16) of the float64 composite rounded to the dtype.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <fuseops/fuseops.h>

#include "test_helpers.h"

#include "ops/cpu/dispatch.h"

namespace {

using fuseops::testing::expect_error_mentions;
using fuseops::testing::kDtypes;
using fuseops::testing::reduction_tolerance;

class CrossEntropy : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(CrossEntropy);
class LinearCrossEntropy : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(LinearCrossEntropy);

void expect_close(const at::Tensor& actual, const at::Tensor& expected, at::ScalarType dtype) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  const double tol = reduction_tolerance(dtype);
  const at::Tensor a = actual.to(at::kDouble);
  const at::Tensor e = expected.to(dtype).to(at::kDouble);
  EXPECT_TRUE(at::allclose(a, e, tol, tol * 0.1 + 1e-6, /*equal_nan=*/true))
      << "max abs diff " << (a - e).abs().nan_to_num(0).max().item<double>();
}

struct Options {
  std::string reduction = "mean";
  int64_t ignore_index = -100;
  double smoothing = 0.0;
  double z_loss = 0.0;
  std::optional<double> softcap;
};

// The float64 composite: log_softmax of the (softcapped) logits, per-row
// terms, then the reduction, as torch.nn.functional.cross_entropy spells it.
at::Tensor composite(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& weight,
                     const Options& o) {
  at::Tensor z = logits.to(at::kDouble);
  if (o.softcap) {
    z = *o.softcap * at::tanh(z / *o.softcap);
  }
  const int64_t vocab = z.size(-1);
  const at::Tensor lse = at::logsumexp(z, {-1});
  const at::Tensor logp = z - lse.unsqueeze(-1);
  const at::Tensor valid = target != o.ignore_index;
  const at::Tensor safe = at::where(valid, target, at::zeros_like(target));
  const at::Tensor w = weight.defined() ? weight.to(at::kDouble) : at::ones({vocab}, z.options());
  const at::Tensor w_t = w.index_select(0, safe.reshape(-1)).view(target.sizes()) * valid;
  const at::Tensor nll = -logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1) * w_t;
  const at::Tensor smooth = -(logp * w).sum(-1) * valid;
  at::Tensor rows =
      (1 - o.smoothing) * nll + o.smoothing / vocab * smooth + o.z_loss * lse * lse * valid;
  if (o.reduction == "none") {
    return rows;
  }
  if (o.reduction == "sum") {
    return rows.sum();
  }
  return rows.sum() / w_t.sum();
}

void check(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& weight,
           const Options& o, at::ScalarType dtype) {
  const std::optional<at::Tensor> w =
      weight.defined() ? std::optional<at::Tensor>(weight) : std::nullopt;
  const at::Tensor expected = composite(logits, target, weight, o);
  auto [loss, lse, total] = fuseops::cross_entropy_forward(
      logits, target, w, o.reduction, o.ignore_index, o.smoothing, o.z_loss, o.softcap);
  expect_close(loss, expected, dtype);

  const at::Tensor grad_out = at::randn(loss.sizes(), loss.options());
  const at::Tensor grad =
      fuseops::cross_entropy_backward(grad_out, logits, target, w, lse, total, o.reduction,
                                      o.ignore_index, o.smoothing, o.z_loss, o.softcap);
  const at::Tensor xd = logits.to(at::kDouble).clone().requires_grad_();
  const at::Tensor want = torch::autograd::grad({composite(xd, target, weight, o)}, {xd},
                                                {grad_out.to(at::kDouble)})[0];
  expect_close(grad, want, dtype);
}

TEST_P(CrossEntropy, ForwardAndBackwardMatchCompositeInEveryCpuBuild) {
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    for (auto dtype : kDtypes) {
      for (int64_t vocab : {1, 7, 33, 1000}) {
        const at::Tensor logits = (at::randn({9, vocab}, options()) * 3).to(dtype);
        const at::Tensor target = at::randint(vocab, {9}, options(at::kLong));
        const at::Tensor weight = at::rand({vocab}, options()) + 0.5;
        for (const Options& o :
             {Options{}, Options{"sum"}, Options{"none"}, Options{"mean", -100, 0.1},
              Options{"sum", -100, 0.0, 1e-3}, Options{"mean", -100, 0.0, 0.0, 2.5},
              Options{"none", 3, 0.2, 1e-2, 4.0}}) {
          SCOPED_TRACE(std::string(c10::toString(dtype)) + " V=" + std::to_string(vocab) + " " +
                       o.reduction);
          // Row 2 is ignored.
          const at::Tensor t = target.clone();
          t[2] = o.ignore_index;
          check(logits, t, at::Tensor(), o, dtype);
          check(logits, t, weight, o, dtype);
        }
      }
    }
  }
}

TEST_P(CrossEntropy, AutogradAndInplaceVariantAgree) {
  const at::Tensor logits = at::randn({6, 50}, options());
  const at::Tensor target = at::randint(50, {6}, options(at::kLong));
  const at::Tensor x = logits.clone().requires_grad_();
  const at::Tensor loss = fuseops::cross_entropy(x, target, std::nullopt, "mean");
  const at::Tensor grad_out = at::full({}, 0.7, options());
  loss.backward(grad_out);

  at::Tensor buffer = logits.clone();
  const at::Tensor leaf = at::zeros({6, 50}, options()).requires_grad_();
  at::Tensor y = leaf + buffer;  // a non-leaf whose storage takes the gradient
  const at::Tensor loss2 = fuseops::cross_entropy_inplace(y, target, std::nullopt, "mean");
  EXPECT_TRUE(at::allclose(loss2, loss.detach(), 1e-6, 1e-6));
  loss2.backward(grad_out);
  EXPECT_TRUE(at::allclose(leaf.grad(), x.grad(), 1e-6, 1e-7));
}

TEST_P(CrossEntropy, AllIgnoredMeanIsNanAndEmptyRowsWork) {
  const at::Tensor logits = at::randn({3, 5}, options());
  const at::Tensor target = at::full({3}, -100, options(at::kLong));
  EXPECT_TRUE(fuseops::cross_entropy(logits, target).isnan().item<bool>());
  EXPECT_EQ(fuseops::cross_entropy(logits, target, std::nullopt, "sum").item<double>(), 0.0);
  const at::Tensor empty = at::randn({0, 5}, options()).requires_grad_();
  const at::Tensor loss =
      fuseops::cross_entropy(empty, at::empty({0}, options(at::kLong)), std::nullopt, "sum");
  loss.backward();
  EXPECT_EQ(empty.grad().sizes(), empty.sizes());
}

TEST(CrossEntropy, BadInputErrorsNameOpAndArgument) {
  const at::Tensor logits = at::randn({4, 10});
  expect_error_mentions(
      [&] { fuseops::cross_entropy(logits, at::tensor({1, 2, 10, 3}, at::kLong)); },
      {"fuseops::cross_entropy", "target", "10", "[0, 10)"});
  expect_error_mentions(
      [&] { fuseops::cross_entropy(logits, at::tensor({1, -2, 0, 3}, at::kLong)); },
      {"fuseops::cross_entropy", "target", "-2"});
  expect_error_mentions([&] { fuseops::cross_entropy(logits, at::zeros({4}, at::kFloat)); },
                        {"fuseops::cross_entropy", "target", "int64"});
  expect_error_mentions([&] { fuseops::cross_entropy(logits, at::zeros({5}, at::kLong)); },
                        {"fuseops::cross_entropy", "target", "shape"});
  expect_error_mentions(
      [&] { fuseops::cross_entropy(logits, at::zeros({4}, at::kLong), std::nullopt, "avg"); },
      {"fuseops::cross_entropy", "reduction", "avg"});
  expect_error_mentions(
      [&] { fuseops::cross_entropy(logits, at::zeros({4}, at::kLong), at::ones({9}), "mean"); },
      {"fuseops::cross_entropy", "weight", "[10]"});
  expect_error_mentions(
      [&] {
        fuseops::cross_entropy(logits, at::zeros({4}, at::kLong), std::nullopt, "mean", -100, 1.5);
      },
      {"fuseops::cross_entropy", "label_smoothing", "1.5"});
  expect_error_mentions(
      [&] {
        fuseops::linear_cross_entropy(at::randn({4, 3}), at::randn({10, 3}), std::nullopt,
                                      at::zeros({4}, at::kLong), std::nullopt, "none", -100, 0.0,
                                      0.0, std::nullopt, 2.0);
      },
      {"fuseops::linear_cross_entropy", "normalizer", "none"});
}

TEST_P(LinearCrossEntropy, MatchesUnfusedCompositeInEveryCpuBuild) {
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    for (auto dtype : {at::kFloat, at::kDouble}) {
      // 300 rows of a vocabulary of 400: chunks of 64 rows, the last one
      // partial.
      const at::Tensor x = at::randn({300, 16}, options()).to(dtype);
      const at::Tensor w = (at::randn({400, 16}, options()) * 0.3).to(dtype);
      const at::Tensor b = at::randn({400}, options()).to(dtype);
      at::Tensor target = at::randint(400, {300}, options(at::kLong));
      target[7] = -100;
      Options o;
      o.smoothing = 0.1;
      o.z_loss = 1e-3;
      o.softcap = 5.0;
      const at::Tensor xi = x.clone().requires_grad_();
      const at::Tensor wi = w.clone().requires_grad_();
      const at::Tensor bi = b.clone().requires_grad_();
      const at::Tensor loss =
          fuseops::linear_cross_entropy(xi, wi, bi, target, std::nullopt, o.reduction,
                                        o.ignore_index, o.smoothing, o.z_loss, o.softcap);
      loss.backward(at::full({}, 0.5, loss.options()));
      const at::Tensor xd = x.to(at::kDouble).clone().requires_grad_();
      const at::Tensor wd = w.to(at::kDouble).clone().requires_grad_();
      const at::Tensor bd = b.to(at::kDouble).clone().requires_grad_();
      const at::Tensor want = composite(at::addmm(bd, xd, wd.t()), target, at::Tensor(), o);
      const auto grads =
          torch::autograd::grad({want}, {xd, wd, bd}, {at::full({}, 0.5, options(at::kDouble))});
      expect_close(loss, want, dtype);
      expect_close(xi.grad(), grads[0], dtype);
      expect_close(wi.grad(), grads[1], dtype);
      expect_close(bi.grad(), grads[2], dtype);
    }
  }
}

// reduction "none": a loss per row, and a backward that recomputes the
// logits for a grad_output per row (here a weight per token).
TEST_P(LinearCrossEntropy, PerRowLossesAndRecomputingBackward) {
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    const at::Tensor x = at::randn({150, 8}, options(at::kDouble));
    const at::Tensor w = at::randn({20, 8}, options(at::kDouble)) * 0.3;
    at::Tensor target = at::randint(20, {150}, options(at::kLong));
    target[3] = -100;
    Options o;
    o.reduction = "none";
    o.z_loss = 1e-3;
    const at::Tensor token_weight = at::rand({150}, options(at::kDouble));
    const at::Tensor xi = x.clone().requires_grad_();
    const at::Tensor wi = w.clone().requires_grad_();
    const at::Tensor loss =
        fuseops::linear_cross_entropy(xi, wi, std::nullopt, target, std::nullopt, o.reduction,
                                      o.ignore_index, o.smoothing, o.z_loss, o.softcap);
    ASSERT_EQ(loss.sizes(), target.sizes());
    loss.backward(token_weight);
    const at::Tensor xd = x.clone().requires_grad_();
    const at::Tensor wd = w.clone().requires_grad_();
    const at::Tensor want = composite(at::mm(xd, wd.t()), target, at::Tensor(), o);
    const auto grads = torch::autograd::grad({want}, {xd, wd}, {token_weight});
    expect_close(loss, want, at::kDouble);
    expect_close(xi.grad(), grads[0], at::kDouble);
    expect_close(wi.grad(), grads[1], at::kDouble);
  }
}

// linear_cross_entropy_stats with predict and softmax_stats: each row's
// logsumexp, argmax and (entropy, mean logit, log sum p^2) of the softcapped
// logits against the float64 logits; ignored rows 0 in lse and the
// statistics. 300 rows: several chunks, the last one partial.
TEST_P(LinearCrossEntropy, SoftmaxStatisticsMatchFloat64InEveryCpuBuild) {
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    for (auto dtype : {at::kFloat, at::kDouble}) {
      const at::Tensor x = at::randn({300, 16}, options()).to(dtype);
      const at::Tensor w = (at::randn({400, 16}, options()) * 0.3).to(dtype);
      const at::Tensor b = at::randn({400}, options()).to(dtype);
      at::Tensor target = at::randint(400, {300}, options(at::kLong));
      target[7] = -100;
      target[299] = -100;
      const double softcap = 5.0;
      auto [loss, lse, predicted, stats] = fuseops::linear_cross_entropy_stats(
          x, w, b, target, std::nullopt, "none", -100, 0.0, 0.0, softcap, std::nullopt,
          /*predict=*/true, /*softmax_stats=*/true);
      ASSERT_EQ(stats.sizes(), (at::IntArrayRef{300, 3}));
      const at::Tensor z = softcap * at::tanh(at::addmm(b.to(at::kDouble), x.to(at::kDouble),
                                                        w.to(at::kDouble).t()) /
                                              softcap);
      const at::Tensor log_p = at::log_softmax(z, -1);
      const at::Tensor counted = (target != -100).to(at::kDouble);
      const at::Tensor want_stats =
          at::stack({-(log_p.exp() * log_p).sum(-1), z.mean(-1), at::logsumexp(2 * log_p, -1)}, 1) *
          counted.unsqueeze(1);
      expect_close(lse, at::logsumexp(z, -1) * counted, dtype);
      expect_close(stats, want_stats, dtype);
      // The argmax where the two largest logits are clearly apart.
      const auto top = z.topk(2, -1);
      const at::Tensor gap = std::get<0>(top).select(1, 0) - std::get<0>(top).select(1, 1);
      const at::Tensor clear = gap > 1e-4;
      EXPECT_GT(clear.sum().item<int64_t>(), 250);
      EXPECT_TRUE(at::equal(predicted.masked_select(clear),
                            std::get<1>(top).select(1, 0).masked_select(clear)));
    }
  }
}

// linear_cross_entropy_forward with reduction "none": grad_input's row i is
// the gradient of loss i alone; weight_grad=false (a frozen head) leaves the
// weight and bias gradients out and grad_input unchanged.
TEST_P(LinearCrossEntropy, ForwardGradientsPerRowWithAndWithoutTheHeads) {
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    const at::Tensor x = at::randn({150, 8}, options(at::kDouble));
    const at::Tensor w = at::randn({20, 8}, options(at::kDouble)) * 0.3;
    const at::Tensor b = at::randn({20}, options(at::kDouble));
    at::Tensor target = at::randint(20, {150}, options(at::kLong));
    target[3] = -100;
    Options o;
    o.reduction = "none";
    const at::Tensor xd = x.clone().requires_grad_();
    const at::Tensor wd = w.clone().requires_grad_();
    const at::Tensor bd = b.clone().requires_grad_();
    const at::Tensor want = composite(at::addmm(bd, xd, wd.t()), target, at::Tensor(), o);
    const auto grads = torch::autograd::grad({want}, {xd, wd, bd}, {at::ones_like(want)});
    for (bool weight_grad : {true, false}) {
      auto [loss, grad_input, grad_weight, grad_bias, lse, predicted, stats] =
          fuseops::linear_cross_entropy_forward(x, w, b, target, std::nullopt, "none", -100, 0.0,
                                                0.0, std::nullopt, std::nullopt, false,
                                                weight_grad);
      expect_close(loss, want, at::kDouble);
      expect_close(grad_input, grads[0], at::kDouble);
      if (weight_grad) {
        expect_close(grad_weight, grads[1], at::kDouble);
        expect_close(grad_bias, grads[2], at::kDouble);
      } else {
        EXPECT_FALSE(grad_weight.defined() && grad_weight.numel() > 0);
        EXPECT_FALSE(grad_bias.defined() && grad_bias.numel() > 0);
      }
    }
  }
}

// Called from many threads at once by threads_test.cpp.
FUSEOPS_THREADS_CASE(cross_entropy) { return {fuseops::cross_entropy(in.x, in.target)}; }

}  // namespace
