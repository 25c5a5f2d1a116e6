// fuseops::jsd (forward, backward, kl_div) and fuseops::fused_linear_jsd
// through the dispatcher, against an ATen composite computed in float64, in
// every compiled CPU build.
//
// Tolerances: float32/float64 within 1e-5 relative + 1e-6 absolute of the
// float64 composite (float32 sums over rows of up to a thousand classes err
// by ~1e-6 relative). bfloat16/float16 take their inputs exactly (widened)
// and round the result once: within 1e-2 (bfloat16) and 2e-3 (float16) of
// the float64 composite rounded to the dtype.

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

class Jsd : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(Jsd);

void expect_close(const at::Tensor& actual, const at::Tensor& expected, at::ScalarType dtype) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  const double tol = reduction_tolerance(dtype);
  const at::Tensor a = actual.to(at::kDouble);
  const at::Tensor e = expected.to(dtype).to(at::kDouble);
  EXPECT_TRUE(at::allclose(a, e, tol, tol * 0.1 + 1e-6, /*equal_nan=*/true))
      << "max abs diff " << (a - e).abs().nan_to_num(0).max().item<double>();
}

struct Options {
  double beta = 0.5;
  double temperature = 1.0;
  std::string reduction = "batchmean";
};

// The float64 composite, from the formulas of ops/jsd.h.
at::Tensor composite(const at::Tensor& student, const at::Tensor& teacher, const at::Tensor& label,
                     const Options& o) {
  const at::Tensor s = at::log_softmax(student.to(at::kDouble) / o.temperature, -1);
  const at::Tensor t = at::log_softmax(teacher.to(at::kDouble) / o.temperature, -1);
  at::Tensor rows;
  if (o.beta == 0.0) {
    rows = (t.exp() * (t - s)).sum(-1);
  } else if (o.beta == 1.0) {
    rows = (s.exp() * (s - t)).sum(-1);
  } else {
    const at::Tensor m = at::logaddexp(t + std::log(o.beta), s + std::log1p(-o.beta));
    rows = o.beta * (t.exp() * (t - m)).sum(-1) + (1 - o.beta) * (s.exp() * (s - m)).sum(-1);
  }
  const at::Tensor valid = label != -100;
  rows = at::where(valid, rows, at::zeros_like(rows));
  if (o.reduction == "none") {
    return rows;
  }
  if (o.reduction == "sum") {
    return rows.sum();
  }
  const at::Tensor count = valid.sum().clamp_min(1).to(at::kDouble);
  return o.reduction == "mean" ? rows.sum() / (count * student.size(-1)) : rows.sum() / count;
}

TEST_P(Jsd, ForwardAndBackwardMatchCompositeInEveryCpuBuild) {
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    for (auto dtype : kDtypes) {
      for (int64_t vocab : {1, 7, 33, 1000}) {
        const at::Tensor student = (at::randn({9, vocab}, options()) * 3).to(dtype);
        const at::Tensor teacher = (at::randn({9, vocab}, options()) * 3).to(dtype);
        at::Tensor label = at::randint(vocab, {9}, options(at::kLong));
        label[2] = -100;  // row 2 is ignored
        for (const Options& o : {Options{}, Options{0.0}, Options{1.0, 2.0}, Options{0.1, 0.5},
                                 Options{0.5, 1.0, "sum"}, Options{0.0, 1.0, "mean"},
                                 Options{1.0, 1.0, "none"}, Options{0.3, 3.0, "none"}}) {
          SCOPED_TRACE(std::string(c10::toString(dtype)) + " V=" + std::to_string(vocab) +
                       " beta=" + std::to_string(o.beta) + " " + o.reduction);
          auto [loss, row_stats] = fuseops::jsd_forward(student, teacher, label, o.beta,
                                                        o.temperature, -100, o.reduction);
          expect_close(loss, composite(student, teacher, label, o), dtype);
          const at::Tensor grad_out = at::randn(loss.sizes(), loss.options());
          const at::Tensor grad =
              fuseops::jsd_backward(grad_out, student, teacher, label, row_stats, o.beta,
                                    o.temperature, -100, o.reduction);
          const at::Tensor xd = student.to(at::kDouble).clone().requires_grad_();
          const at::Tensor want = torch::autograd::grad({composite(xd, teacher, label, o)}, {xd},
                                                        {grad_out.to(at::kDouble)})[0];
          expect_close(grad, want, dtype);
        }
      }
    }
  }
}

TEST_P(Jsd, AutogradKlDivAndNoCountedRows) {
  const at::Tensor student = at::randn({6, 50}, options()).requires_grad_();
  const at::Tensor teacher = at::randn({6, 50}, options());
  const at::Tensor loss = fuseops::kl_div(student, teacher);
  const at::Tensor expected =
      composite(student.detach(), teacher, at::zeros({6}, options(at::kLong)), Options{0.0});
  EXPECT_TRUE(at::allclose(loss.to(at::kDouble), expected, 1e-5, 1e-6));
  loss.backward();
  EXPECT_TRUE(at::allclose(student.grad(),
                           (at::softmax(student.detach(), -1) - at::softmax(teacher, -1)) / 6, 1e-5,
                           1e-7));
  // No counted row: batchmean and mean are 0, with a zero gradient.
  const at::Tensor ignored = at::full({6}, -100, options(at::kLong));
  const at::Tensor x = at::randn({6, 50}, options()).requires_grad_();
  const at::Tensor none_counted = fuseops::jsd(x, teacher, ignored);
  EXPECT_EQ(none_counted.item<double>(), 0.0);
  none_counted.backward();
  EXPECT_EQ(x.grad().abs().sum().item<double>(), 0.0);
  const at::Tensor empty = at::randn({0, 5}, options()).requires_grad_();
  const at::Tensor empty_loss = fuseops::jsd(empty, at::randn({0, 5}, options()));
  EXPECT_EQ(empty_loss.item<double>(), 0.0);
  empty_loss.backward();
  EXPECT_EQ(empty.grad().sizes(), empty.sizes());
}

TEST(Jsd, BadInputErrorsNameOpAndArgument) {
  const at::Tensor x = at::randn({4, 10});
  expect_error_mentions([&] { fuseops::jsd(x, at::randn({4, 9})); },
                        {"fuseops::jsd", "teacher_logits", "shape"});
  expect_error_mentions([&] { fuseops::jsd(x, x.to(at::kDouble)); },
                        {"fuseops::jsd", "teacher_logits", "dtype"});
  expect_error_mentions([&] { fuseops::jsd(at::randn({4, 0}), at::randn({4, 0})); },
                        {"fuseops::jsd", "student_logits", "one class"});
  expect_error_mentions([&] { fuseops::jsd(x, x, at::zeros({4}, at::kFloat)); },
                        {"fuseops::jsd", "label", "int64"});
  expect_error_mentions([&] { fuseops::jsd(x, x, at::zeros({5}, at::kLong)); },
                        {"fuseops::jsd", "label", "shape"});
  expect_error_mentions([&] { fuseops::jsd(x, x, std::nullopt, 1.5); },
                        {"fuseops::jsd", "beta", "1.5"});
  expect_error_mentions([&] { fuseops::jsd(x, x, std::nullopt, 0.5, 0.0); },
                        {"fuseops::jsd", "temperature", "0"});
  expect_error_mentions([&] { fuseops::jsd(x, x, std::nullopt, 0.5, 1.0, -100, "avg"); },
                        {"fuseops::jsd", "reduction", "avg"});
  expect_error_mentions([&] { fuseops::jsd(x, x.clone().requires_grad_()); },
                        {"fuseops::jsd", "teacher_logits", "requires grad"});
}

// fused_linear_jsd: the composite on the float64 logits of the same inputs.
// float32/float64 within 1e-5 (the GEMMs' float32 sums over H = 16 add
// ~1e-7); bfloat16 within 2e-2 of each result's largest value (the logits
// and the gradients leave bfloat16 GEMMs, 2^-9 relative each, two or three
// roundings on the way).
TEST_P(Jsd, FusedLinearMatchesCompositeInEveryCpuBuild) {
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
      // 150 rows of a vocabulary of 370: chunks of 64, the last one partial.
      const at::Tensor xs = at::randn({150, 16}, options()).to(dtype);
      const at::Tensor ws = (at::randn({370, 16}, options()) * 0.75).to(dtype);
      const at::Tensor xt = at::randn({150, 8}, options()).to(dtype);
      const at::Tensor wt = at::randn({370, 8}, options()).to(dtype);
      at::Tensor label = at::randint(370, {150}, options(at::kLong));
      label.slice(0, 0, 150, 7).fill_(-100);
      const double tol = dtype == at::kBFloat16 ? 2e-2 : 1e-5;
      for (const Options& o : {Options{}, Options{0.0, 2.0, "sum"}, Options{1.0, 1.0, "mean"},
                               Options{0.3, 0.5, "none"}}) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " beta=" + std::to_string(o.beta) + " " +
                     o.reduction);
        const at::Tensor xi = xs.clone().requires_grad_();
        const at::Tensor wi = ws.clone().requires_grad_();
        const at::Tensor loss = fuseops::fused_linear_jsd(xi, wi, xt, wt, label, o.beta,
                                                          o.temperature, -100, o.reduction);
        const at::Tensor grad_out = at::rand(loss.sizes(), options()).to(dtype) + 0.5;
        loss.backward(grad_out);
        const at::Tensor xd = xs.detach().to(at::kDouble).clone().requires_grad_();
        const at::Tensor wd = ws.detach().to(at::kDouble).clone().requires_grad_();
        const at::Tensor want = composite(
            at::linear(xd, wd), at::linear(xt.to(at::kDouble), wt.to(at::kDouble)), label, o);
        const auto grads = torch::autograd::grad({want}, {xd, wd}, {grad_out.to(at::kDouble)});
        for (const auto& [got, expected] :
             {std::pair{loss, want.detach()}, {xi.grad(), grads[0]}, {wi.grad(), grads[1]}}) {
          ASSERT_EQ(got.scalar_type(), dtype);
          const double scale = std::max(expected.abs().max().item<double>(), 1e-30);
          EXPECT_TRUE(at::allclose(got.to(at::kDouble), expected, tol, tol * scale))
              << "max abs diff " << (got.to(at::kDouble) - expected).abs().max().item<double>()
              << " of " << scale;
        }
      }
    }
  }
}

TEST(Jsd, FusedLinearBadInputErrorsNameOpAndArgument) {
  const at::Tensor xs = at::randn({4, 3});
  const at::Tensor ws = at::randn({10, 3});
  const at::Tensor xt = at::randn({4, 5});
  const at::Tensor wt = at::randn({10, 5});
  const char* op = "fuseops::fused_linear_jsd";
  expect_error_mentions([&] { fuseops::fused_linear_jsd(xs, ws.slice(1, 0, 2), xt, wt); },
                        {op, "student_weight", "[V, 3]"});
  expect_error_mentions([&] { fuseops::fused_linear_jsd(xs, ws, xt.slice(0, 0, 3), wt); },
                        {op, "teacher_input", "4 rows"});
  expect_error_mentions([&] { fuseops::fused_linear_jsd(xs, ws, xt, wt.slice(0, 0, 9)); },
                        {op, "teacher_weight", "10 rows"});
  expect_error_mentions(
      [&] { fuseops::fused_linear_jsd(xs, ws, xt.to(at::kDouble), wt.to(at::kDouble)); },
      {op, "teacher_input", "dtype"});
  expect_error_mentions(
      [&] { fuseops::fused_linear_jsd(xs, ws, xt, wt, at::zeros({5}, at::kLong)); },
      {op, "label", "[4]"});
  expect_error_mentions(
      [&] { fuseops::fused_linear_jsd(xs, ws, xt, wt, std::nullopt, 0.5, 1.0, -100, "avg"); },
      {op, "reduction", "avg"});
  expect_error_mentions(
      [&] { fuseops::fused_linear_jsd(xs.requires_grad_(), ws, xt, wt.clone().requires_grad_()); },
      {op, "teacher_weight", "requires grad"});
}

// Called from many threads at once by threads_test.cpp.
FUSEOPS_THREADS_CASE(jsd) { return {fuseops::jsd(in.x, in.g, in.target)}; }

}  // namespace
