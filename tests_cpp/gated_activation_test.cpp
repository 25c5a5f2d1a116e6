// fuseops::swiglu and geglu (separate and packed, forward and backward)
// through the dispatcher, against ATen composites in float64, on every
// compiled CPU build. Tolerances as in activation_test.cpp: 1e-5 relative
// for float32/float64, one rounding (doubled) for bfloat16/float16.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <fuseops/fuseops.h>

#include "test_helpers.h"

#include "ops/cpu/dispatch.h"

namespace {

using fuseops::testing::absmax;
using fuseops::testing::elementwise_tolerance;
using fuseops::testing::expect_error_mentions;
using fuseops::testing::kDtypes;

class Gated : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(Gated);

// `scale`: the largest factor multiplying the activation (up, the upstream
// gradient), which scales the absolute floor too.
void expect_close(const at::Tensor& actual, const at::Tensor& expected_double, double scale = 1.0) {
  ASSERT_EQ(actual.sizes(), expected_double.sizes());
  const double tol = elementwise_tolerance(actual.scalar_type());
  const at::Tensor err = (actual.to(at::kDouble) - expected_double).abs();
  const at::Tensor bound =
      tol * expected_double.abs() + std::max(tol / 10, 2e-6) * std::max(1.0, scale);
  EXPECT_TRUE((err <= bound).all().item<bool>())
      << "max abs error " << (err.numel() ? err.max().item<double>() : 0.0);
}

at::Tensor random_input(at::IntArrayRef shape, at::ScalarType dtype, at::Device device) {
  return (at::randn(shape, at::TensorOptions(at::kDouble).device(device)) * 3).to(dtype);
}

// form: "silu" (swiglu) or a GELU approximation (geglu).
struct Reference {
  std::string form;
  at::Tensor act(const at::Tensor& x) const {
    return form == "silu" ? at::silu(x) : at::gelu(x, form);
  }
  at::Tensor act_grad(const at::Tensor& g, const at::Tensor& x) const {
    return form == "silu" ? at::silu_backward(g, x) : at::gelu_backward(g, x, form);
  }
};

at::Tensor forward(const std::string& form, const at::Tensor& gate, const at::Tensor& up) {
  return form == "silu" ? fuseops::swiglu(gate, up) : fuseops::geglu(gate, up, form);
}
at::Tensor forward_packed(const std::string& form, const at::Tensor& input) {
  return form == "silu" ? fuseops::swiglu_packed(input) : fuseops::geglu_packed(input, form);
}
std::tuple<at::Tensor, at::Tensor> backward(const std::string& form, const at::Tensor& g,
                                            const at::Tensor& gate, const at::Tensor& up) {
  return form == "silu" ? fuseops::swiglu_backward(g, gate, up)
                        : fuseops::geglu_backward(g, gate, up, form);
}
at::Tensor backward_packed(const std::string& form, const at::Tensor& g, const at::Tensor& input) {
  return form == "silu" ? fuseops::swiglu_packed_backward(g, input)
                        : fuseops::geglu_packed_backward(g, input, form);
}

const std::vector<std::string> kForms = {"silu", "none", "tanh"};

TEST_P(Gated, SeparateAndPackedMatchFloat64OnEveryBuild) {
  const std::vector<std::vector<int64_t>> shapes = {{0, 4},    {7},       {3, 17},
                                                    {2, 0, 3}, {300, 67}, {2, 33, 130}};
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    for (auto dtype : kDtypes) {
      for (const auto& form : kForms) {
        for (const auto& shape : shapes) {
          SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " "
                                          << dtype << " " << form << " " << at::IntArrayRef(shape));
          const Reference ref{form};
          std::vector<int64_t> packed_shape = shape;
          packed_shape.back() *= 2;
          const at::Tensor packed = random_input(packed_shape, dtype, device());
          const auto halves = packed.chunk(2, -1);
          const at::Tensor gate = halves[0];  // non-contiguous views
          const at::Tensor up = halves[1];
          const at::Tensor g = random_input(shape, dtype, device());
          const at::Tensor gate64 = gate.to(at::kDouble);
          const at::Tensor up64 = up.to(at::kDouble);
          const at::Tensor g64 = g.to(at::kDouble);

          const double scale = absmax(packed) * absmax(g);
          const at::Tensor expected = ref.act(gate64) * up64;
          expect_close(forward(form, gate, up), expected, scale);
          expect_close(forward(form, gate.contiguous(), up.contiguous()), expected, scale);
          expect_close(forward_packed(form, packed), expected, scale);

          const at::Tensor expected_grad_gate = ref.act_grad(g64 * up64, gate64);
          const at::Tensor expected_grad_up = g64 * ref.act(gate64);
          const auto [grad_gate, grad_up] = backward(form, g, gate, up);
          expect_close(grad_gate, expected_grad_gate, scale);
          expect_close(grad_up, expected_grad_up, scale);
          expect_close(backward_packed(form, g, packed),
                       at::cat({expected_grad_gate, expected_grad_up}, -1), scale);
        }
      }
    }
  }
}

TEST_P(Gated, AutogradInCppSeparateAndPacked) {
  for (const auto& form : kForms) {
    SCOPED_TRACE(form);
    const Reference ref{form};
    const at::Tensor packed = random_input({5, 2 * 19}, at::kDouble, device()).requires_grad_();
    const at::Tensor upstream = random_input({5, 19}, at::kDouble, device());
    forward_packed(form, packed).backward(upstream);
    const at::Tensor gate = packed.detach().narrow(1, 0, 19);
    const at::Tensor up = packed.detach().narrow(1, 19, 19);
    const double scale = absmax(upstream) * absmax(packed);
    expect_close(packed.grad(),
                 at::cat({ref.act_grad(upstream * up, gate), upstream * ref.act(gate)}, 1), scale);
    const at::Tensor gate_leaf = gate.clone().requires_grad_();
    const at::Tensor up_leaf = up.clone().requires_grad_();
    forward(form, gate_leaf, up_leaf).backward(upstream);
    expect_close(gate_leaf.grad(), ref.act_grad(upstream * up, gate), scale);
    expect_close(up_leaf.grad(), upstream * ref.act(gate), scale);
  }
}

TEST_P(Gated, OutVariants) {
  const at::Tensor packed = random_input({6, 20}, at::kFloat, device());
  const at::Tensor gate = packed.narrow(1, 0, 10).to(at::kDouble);
  const at::Tensor up = packed.narrow(1, 10, 10).to(at::kDouble);
  at::Tensor out = at::empty({6, 10}, options());
  EXPECT_EQ(fuseops::swiglu_packed_out(packed, out).data_ptr(), out.data_ptr());
  expect_close(out, at::silu(gate) * up);
  at::Tensor out_t = at::empty({10, 6}, options()).t();
  fuseops::geglu_out(packed.narrow(1, 0, 10), packed.narrow(1, 10, 10), "tanh", out_t);
  expect_close(out_t, at::gelu(gate, "tanh") * up);
  at::Tensor small = at::empty({0}, options());
  fuseops::geglu_packed_out(packed, "none", small);
  expect_close(small, at::gelu(gate) * up);
  // out aliasing the gate half of its own input: written through a temporary.
  at::Tensor buffer = packed.clone();
  at::Tensor gate_view = buffer.narrow(1, 0, 10);
  fuseops::swiglu_out(gate_view, buffer.narrow(1, 10, 10), gate_view);
  expect_close(gate_view, at::silu(gate) * up);
}

TEST(Gated, BadInputErrorsNameOpAndArgument) {
  expect_error_mentions([] { fuseops::swiglu(at::ones({3, 4}), at::ones({3, 5})); },
                        {"fuseops::swiglu", "'up'", "shape"});
  expect_error_mentions([] { fuseops::swiglu(at::ones({3}), at::ones({3}, at::kDouble)); },
                        {"fuseops::swiglu", "'up'", "dtype"});
  expect_error_mentions([] { fuseops::swiglu_packed(at::ones({3, 5})); },
                        {"fuseops::swiglu.packed", "'input'", "even", "[3, 5]"});
  expect_error_mentions([] { fuseops::geglu(at::ones({3}), at::ones({3}), "fast"); },
                        {"fuseops::geglu", "'approximate'", "'fast'"});
  expect_error_mentions([] { fuseops::geglu_packed(at::ones({2, 4}), ""); },
                        {"fuseops::geglu.packed", "'approximate'"});
  expect_error_mentions([] { fuseops::swiglu_packed_backward(at::ones({3, 4}), at::ones({3, 4})); },
                        {"fuseops::swiglu_backward.packed", "'grad_output'", "[3, 2]"});
}

TEST(Gated, MetaTensorsGiveShapesOnly) {
  const auto meta = at::TensorOptions().device(at::kMeta).dtype(at::kHalf);
  EXPECT_EQ(fuseops::swiglu_packed(at::empty({4, 6}, meta)).sizes(), at::IntArrayRef({4, 3}));
  EXPECT_EQ(
      fuseops::geglu_packed_backward(at::empty({4, 3}, meta), at::empty({4, 6}, meta)).sizes(),
      at::IntArrayRef({4, 6}));
}

// out= overlapping a strided input (the report of the fuzzer): ATen calls
// this overlap "too hard"; it must be computed as if the inputs were copied.
TEST_P(Gated, OutOverlappingAStridedInput) {
  at::Tensor buffer = at::arange(1, 7, options(at::kDouble)).view({3, 2});
  const at::Tensor gate = buffer.narrow(1, 0, 1).clone();
  const at::Tensor up = buffer.narrow(1, 1, 1).clone();
  at::Tensor out = buffer.view({-1}).slice(0, 2, 5).view({3, 1});
  fuseops::swiglu_packed_out(buffer, out);
  EXPECT_TRUE(at::allclose(out, at::silu(gate) * up, 1e-12, 1e-12));
  EXPECT_NEAR(out[1].item<double>(), 11.431, 1e-3);
}

TEST(Gated, MissingTensorThroughTheDispatcherNamesTheArgument) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fuseops::swiglu", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  expect_error_mentions([] { op.call(at::Tensor(), at::ones({2, 3})); },
                        {"fuseops::swiglu", "'gate'", "undefined"});
}

TEST(Gated, InternallyOverlappingOutIsRefused) {
  at::Tensor out = at::empty({1, 8}).expand({4, 8});
  expect_error_mentions([&] { fuseops::swiglu_out(at::ones({4, 8}), at::ones({4, 8}), out); },
                        {"fuseops::swiglu.out", "'out'", "share memory"});
}

// Called from many threads at once by threads_test.cpp.
FUSEOPS_THREADS_CASE(gated_activation) { return {fuseops::swiglu(in.x, in.g)}; }

}  // namespace
