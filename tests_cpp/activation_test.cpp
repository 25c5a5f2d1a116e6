// fuseops::gelu, silu, bias_gelu (forward and backward) through the
// dispatcher, against ATen composites computed in float64, on every
// compiled CPU build.
//
// Tolerances: float32/float64 results must be within 1e-5 relative (plus a
// 2e-6 absolute floor near zero) of the float64 reference: the vectorized
// erf/tanh/exp are accurate to a few ulp, and the floor covers the tanh
// form's 1 + tanh(u), which cancels to 0 in float32 for x < -5 (as in ATen's
// own kernel) where the true value is still up to ~1.1e-6. bfloat16/float16 are computed in
// float32 and rounded once, so they must be within one rounding of the
// reference: 2^-8 (bfloat16) / 2^-11 (float16) relative, doubled for slack.

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <fuseops/fuseops.h>

#include "test_helpers.h"

#include "ops/cpu/dispatch.h"

namespace {

using fuseops::testing::absmax;
using fuseops::testing::elementwise_tolerance;
using fuseops::testing::expect_error_mentions;
using fuseops::testing::kDtypes;

using fuseops::cpu::CpuCapability;

class Gelu : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(Gelu);
class Silu : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(Silu);
class BiasGelu : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(BiasGelu);
class Activation : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(Activation);

const std::vector<std::string> kApproximations = {"none", "tanh"};

// `scale`: the largest factor multiplying the activation (the upstream
// gradient in backward), which scales the absolute floor too.
void expect_close(const at::Tensor& actual, const at::Tensor& expected_double, double scale = 1.0) {
  ASSERT_EQ(actual.sizes(), expected_double.sizes());
  const double tol = elementwise_tolerance(actual.scalar_type());
  const at::Tensor a = actual.to(at::kDouble);
  EXPECT_TRUE(at::equal(a.isnan(), expected_double.isnan()));
  const at::Tensor finite = expected_double.isfinite();
  EXPECT_TRUE(at::equal(a.masked_select(~finite & ~expected_double.isnan()),
                        expected_double.masked_select(~finite & ~expected_double.isnan())));
  const at::Tensor err = (a - expected_double).abs().masked_select(finite);
  const double atol = std::max(tol / 10, 2e-6) * std::max(1.0, scale);
  const at::Tensor bound = (tol * expected_double.abs() + atol).masked_select(finite);
  EXPECT_TRUE((err <= bound).all().item<bool>())
      << "max abs error " << (err.numel() ? err.max().item<double>() : 0.0);
}

at::Tensor gelu_ref(const at::Tensor& x, const std::string& approximate) {
  return at::gelu(x.to(at::kDouble), approximate);
}
at::Tensor gelu_grad_ref(const at::Tensor& g, const at::Tensor& x, const std::string& approx) {
  return at::gelu_backward(g.to(at::kDouble), x.to(at::kDouble), approx);
}

at::Tensor random_input(at::IntArrayRef shape, at::ScalarType dtype, at::Device device) {
  return (at::randn(shape, at::TensorOptions(at::kDouble).device(device)) * 3).to(dtype);
}

// Shapes: empty, scalar, partial vectors, rows shorter than a vector,
// several parallel chunks with a tail.
const std::vector<std::vector<int64_t>> kShapes = {{0},       {},        {7},       {3, 17},
                                                   {5, 0, 3}, {300, 67}, {40, 4099}};

TEST_P(Gelu, ForwardAndBackwardMatchFloat64OnEveryBuild) {
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    for (auto dtype : kDtypes) {
      for (const auto& approximate : kApproximations) {
        for (const auto& shape : kShapes) {
          SCOPED_TRACE(testing::Message()
                       << fuseops::cpu::capability_name(capability) << " " << dtype << " "
                       << approximate << " " << at::IntArrayRef(shape));
          const at::Tensor x = random_input(shape, dtype, device());
          const at::Tensor g = random_input(shape, dtype, device());
          expect_close(fuseops::gelu(x, approximate), gelu_ref(x, approximate));
          expect_close(fuseops::gelu_backward(g, x, approximate), gelu_grad_ref(g, x, approximate),
                       absmax(g));
        }
      }
    }
  }
}

TEST_P(Silu, ForwardAndBackwardMatchFloat64OnEveryBuild) {
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    for (auto dtype : kDtypes) {
      for (const auto& shape : kShapes) {
        SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype
                                        << " " << at::IntArrayRef(shape));
        const at::Tensor x = random_input(shape, dtype, device());
        const at::Tensor g = random_input(shape, dtype, device());
        expect_close(fuseops::silu(x), at::silu(x.to(at::kDouble)));
        expect_close(fuseops::silu_backward(g, x),
                     at::silu_backward(g.to(at::kDouble), x.to(at::kDouble)), absmax(g));
      }
    }
  }
}

// The activations and their derivatives evaluated in scalar float64 with
// IEEE special-value rules: the exact math the kernels must follow, NaN/Inf
// included. Not ATen: its special values differ between its own CPU builds
// (the AVX-512 float32 gelu(+Inf) is NaN).
double exact_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double exact_value(const std::string& act, double x) {
  if (act == "silu") {
    return x * exact_sigmoid(x);
  }
  if (act == "none") {
    return x * 0.5 * (1.0 + std::erf(x * M_SQRT1_2));
  }
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return x * exact_sigmoid(2.0 * u);  // 0.5 (1 + tanh(u)) without cancellation
}

double exact_derivative(const std::string& act, double x) {
  if (act == "silu") {
    const double s = exact_sigmoid(x);
    return s * (1.0 + x * (1.0 - s));
  }
  if (act == "none") {
    return 0.5 * (1.0 + std::erf(x * M_SQRT1_2)) +
           x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
  }
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  const double du = std::sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
  const double s = exact_sigmoid(2.0 * u);
  return s + 2.0 * x * s * (1.0 - s) * du;
}

at::Tensor exact(const at::Tensor& x, double (*f)(const std::string&, double),
                 const std::string& act) {
  const at::Tensor x64 = x.to(at::kDouble).cpu().contiguous();
  at::Tensor y = at::empty_like(x64);
  for (int64_t i = 0; i < x64.numel(); ++i) {
    y.data_ptr<double>()[i] = f(act, x64.const_data_ptr<double>()[i]);
  }
  return y.to(x.device());
}

TEST_P(Activation, SpecialValuesFollowFloat64MathOnEveryBuild) {
  const double inf = std::numeric_limits<double>::infinity();
  // 17 values: a full vector of every build plus a tail.
  const at::Tensor x64 =
      at::tensor({0.0, -0.0, 1.0, -1.0, 30.0, -30.0, 100.0, -100.0, inf, -inf,
                  std::numeric_limits<double>::quiet_NaN(), 3.0, -3.0, 0.5, -0.5, 1e-30, -1e-30},
                 options(at::kDouble));
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    for (auto dtype : kDtypes) {
      const at::Tensor x = x64.to(dtype);
      const at::Tensor g = at::ones_like(x);
      for (const std::string act : {"none", "tanh", "silu"}) {
        SCOPED_TRACE(testing::Message()
                     << fuseops::cpu::capability_name(capability) << " " << dtype << " " << act);
        const at::Tensor y = act == "silu" ? fuseops::silu(x) : fuseops::gelu(x, act);
        const at::Tensor dy =
            act == "silu" ? fuseops::silu_backward(g, x) : fuseops::gelu_backward(g, x, act);
        expect_close(y, exact(x, exact_value, act));
        expect_close(dy, exact(x, exact_derivative, act));
      }
    }
  }
}

// bfloat16/float16 results are the float32 result rounded once, to nearest
// with ties to even (as ATen's .to() rounds), bit for bit, in every build:
// the AVX512 build rounds bfloat16 with its own instruction where the CPU
// has AVX512_BF16.
TEST_P(Activation, ReducedPrecisionIsTheFloat32ResultRoundedOnce) {
  const at::Tensor x64 = at::randn({4099}, options(at::kDouble)) * 3;
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    for (auto dtype : {at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype);
      const at::Tensor x = x64.to(dtype);
      const at::Tensor x32 = x.to(at::kFloat);
      EXPECT_TRUE(at::equal(fuseops::silu(x), fuseops::silu(x32).to(dtype)));
      EXPECT_TRUE(at::equal(fuseops::gelu(x, "none"), fuseops::gelu(x32, "none").to(dtype)));
      EXPECT_TRUE(
          at::equal(fuseops::silu_backward(x, x), fuseops::silu_backward(x32, x32).to(dtype)));
    }
  }
}

TEST_P(BiasGelu, ForwardAndBackwardMatchFloat64OnEveryBuild) {
  const std::vector<std::vector<int64_t>> shapes = {{0, 5},    {7},          {3, 17},   {2, 0, 3},
                                                    {300, 67}, {2, 33, 130}, {1100, 64}};
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    for (auto dtype : kDtypes) {
      for (const auto& approximate : kApproximations) {
        for (const auto& shape : shapes) {
          SCOPED_TRACE(testing::Message()
                       << fuseops::cpu::capability_name(capability) << " " << dtype << " "
                       << approximate << " " << at::IntArrayRef(shape));
          const at::Tensor x = random_input(shape, dtype, device());
          const at::Tensor b = random_input({shape.back()}, dtype, device());
          const at::Tensor g = random_input(shape, dtype, device());
          const at::Tensor z = x.to(at::kDouble) + b.to(at::kDouble);
          expect_close(fuseops::bias_gelu(x, b, approximate), at::gelu(z, approximate));
          const auto [grad_input, grad_bias] = fuseops::bias_gelu_backward(g, x, b, approximate);
          const at::Tensor expected_grad_input = gelu_grad_ref(g, z, approximate);
          expect_close(grad_input, expected_grad_input, absmax(g));
          ASSERT_EQ(grad_bias.scalar_type(), dtype);
          // A sum over rows: the float64 reference sum of the exact terms;
          // float32 accumulation adds relative error ~ rows * 2^-24.
          const at::Tensor expected_grad_bias =
              expected_grad_input.reshape({-1, shape.back()}).sum(0);
          const at::Tensor err = (grad_bias.to(at::kDouble) - expected_grad_bias).abs();
          const at::Tensor scale = expected_grad_input.abs().reshape({-1, shape.back()}).sum(0) + 1;
          EXPECT_TRUE((err <= elementwise_tolerance(dtype) * scale).all().item<bool>())
              << "grad_bias max error " << err.max().item<double>();
        }
      }
    }
  }
}

TEST_P(Activation, NonContiguousInputs) {
  const at::Tensor base = random_input({40, 70}, at::kFloat, device());
  const at::Tensor transposed = base.t();
  const at::Tensor strided = base.slice(1, 1, 70, 3);
  for (const auto& x : {transposed, strided}) {
    ASSERT_FALSE(x.is_contiguous());
    const at::Tensor g = random_input(x.sizes(), at::kFloat, device()).t().contiguous().t();
    expect_close(fuseops::gelu(x), gelu_ref(x, "none"));
    expect_close(fuseops::silu(x), at::silu(x.to(at::kDouble)));
    expect_close(fuseops::gelu_backward(g.view(x.sizes()), x, "tanh"),
                 gelu_grad_ref(g.view(x.sizes()), x, "tanh"), absmax(g));
    const at::Tensor b =
        random_input({x.size(1) * 2}, at::kFloat, device()).slice(0, 0, x.size(1) * 2, 2);
    expect_close(fuseops::bias_gelu(x, b), at::gelu(x.to(at::kDouble) + b.to(at::kDouble)));
  }
}

TEST_P(Activation, AutogradInCpp) {
  const at::Tensor x = random_input({13, 29}, at::kDouble, device()).requires_grad_();
  const at::Tensor b = random_input({29}, at::kDouble, device()).requires_grad_();
  const at::Tensor upstream = random_input({13, 29}, at::kDouble, device());

  fuseops::gelu(x, "tanh").backward(upstream);
  expect_close(x.grad(), at::gelu_backward(upstream, x.detach(), "tanh"), absmax(upstream));
  x.mutable_grad().reset();

  fuseops::silu(x).backward(upstream);
  expect_close(x.grad(), at::silu_backward(upstream, x.detach()));
  x.mutable_grad().reset();

  fuseops::bias_gelu(x, b).backward(upstream);
  const at::Tensor expected = at::gelu_backward(upstream, x.detach() + b.detach());
  expect_close(x.grad(), expected);
  expect_close(b.grad(), expected.sum(0));
}

TEST_P(Activation, DoubleBackwardOfGeluAndSilu) {
  for (const std::string form : {"none", "tanh", "silu"}) {
    SCOPED_TRACE(form);
    const at::Tensor x = random_input({9, 11}, at::kDouble, device()).requires_grad_();
    const at::Tensor upstream = random_input({9, 11}, at::kDouble, device());
    auto f = [&](const at::Tensor& t) {
      return form == "silu" ? fuseops::silu(t) : fuseops::gelu(t, form);
    };
    auto aten = [&](const at::Tensor& t) {
      return form == "silu" ? at::silu(t) : at::gelu(t, form);
    };
    const auto first = torch::autograd::grad({f(x)}, {x}, {upstream}, true, true);
    const auto second = torch::autograd::grad({first[0].sum()}, {x});
    const at::Tensor x_ref = x.detach().clone().requires_grad_();
    const auto first_ref = torch::autograd::grad({aten(x_ref)}, {x_ref}, {upstream}, true, true);
    const auto second_ref = torch::autograd::grad({first_ref[0].sum()}, {x_ref});
    expect_close(second[0], second_ref[0]);
  }
}

TEST_P(Activation, OutVariants) {
  const at::Tensor x = random_input({6, 10}, at::kFloat, device());
  const at::Tensor b = random_input({10}, at::kFloat, device());
  at::Tensor out = at::empty({6, 10}, options());
  EXPECT_EQ(fuseops::gelu_out(x, "tanh", out).data_ptr(), out.data_ptr());
  expect_close(out, gelu_ref(x, "tanh"));
  at::Tensor out_t = at::empty({10, 6}, options()).t();
  fuseops::silu_out(x, out_t);
  EXPECT_FALSE(out_t.is_contiguous());
  expect_close(out_t, at::silu(x.to(at::kDouble)));
  at::Tensor small = at::empty({0}, options());
  fuseops::bias_gelu_out(x, b, "none", small);
  expect_close(small, at::gelu(x.to(at::kDouble) + b.to(at::kDouble)));
  // In place.
  at::Tensor y = x.clone();
  fuseops::gelu_out(y, "none", y);
  expect_close(y, gelu_ref(x, "none"));
}

TEST(Activation, BadInputErrorsNameOpAndArgument) {
  expect_error_mentions([] { fuseops::gelu(at::ones({3}), "exact"); },
                        {"fuseops::gelu", "'approximate'", "'none' or 'tanh'", "'exact'"});
  expect_error_mentions([] { fuseops::gelu(at::ones({3}, at::kInt)); },
                        {"fuseops::gelu", "'input'", "Int"});
  expect_error_mentions([] { fuseops::silu(at::Tensor()); },
                        {"fuseops::silu", "'input'", "undefined"});
  expect_error_mentions([] { fuseops::silu_backward(at::ones({3}), at::ones({4})); },
                        {"fuseops::silu_backward", "'grad_output'", "shape"});
  expect_error_mentions([] { fuseops::bias_gelu(at::ones({3, 4}), at::ones({3})); },
                        {"fuseops::bias_gelu", "'bias'", "size"});
  expect_error_mentions([] { fuseops::bias_gelu(at::ones({3, 4}), at::ones({4}, at::kDouble)); },
                        {"fuseops::bias_gelu", "'bias'", "dtype"});
  expect_error_mentions(
      [] { fuseops::bias_gelu_backward(at::ones({3, 4}), at::ones({3, 4}), at::ones({4}), "x"); },
      {"fuseops::bias_gelu_backward", "'approximate'"});
  expect_error_mentions(
      [] {
        at::Tensor out = at::empty({3}, at::kDouble);
        fuseops::gelu_out(at::ones({3}), "none", out);
      },
      {"fuseops::gelu.out", "'out'", "dtype"});
}

TEST(Activation, MetaTensorsGiveShapesOnly) {
  const auto meta = at::TensorOptions().device(at::kMeta).dtype(at::kBFloat16);
  const at::Tensor x = at::empty({4, 5}, meta);
  EXPECT_TRUE(fuseops::gelu(x, "tanh").is_meta());
  EXPECT_EQ(fuseops::silu(x).sizes(), x.sizes());
  const auto [gi, gb] = fuseops::bias_gelu_backward(x, x, at::empty({5}, meta));
  EXPECT_EQ(gb.sizes(), at::IntArrayRef({5}));
}

// Called from many threads at once by threads_test.cpp.
FUSEOPS_THREADS_CASE(activation) { return {fuseops::gelu(in.x, "tanh"), fuseops::silu(in.x)}; }

}  // namespace
