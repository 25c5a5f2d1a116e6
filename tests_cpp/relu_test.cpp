// fuseops::relu and relu_backward through the dispatcher, against ATen's
// at::relu and at::threshold_backward. relu is exact (a select), so results
// must be bit-identical in every dtype.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <fuseops/fuseops.h>

#include "test_helpers.h"

namespace {

using fuseops::testing::expect_error_mentions;
using fuseops::testing::kDtypes;

class Relu : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(Relu);

// Sizes that exercise: empty, a scalar, partial vectors, several parallel
// chunks with a tail.
const std::vector<std::vector<int64_t>> kShapes = {{0},     {},        {1},          {7},
                                                   {3, 17}, {5, 0, 3}, {2, 3, 4, 5}, {300001}};

at::Tensor random_with_special_values(at::IntArrayRef shape, const at::TensorOptions& options) {
  at::Tensor t = at::randn(shape, options);
  if (t.numel() >= 4) {
    auto flat = t.view({-1});
    flat[0] = 0.0;
    flat[1] = -0.0;
    flat[2] = std::numeric_limits<double>::quiet_NaN();
    flat[3] = -std::numeric_limits<double>::infinity();
  }
  return t;
}

void expect_identical(const at::Tensor& actual, const at::Tensor& expected) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type());
  EXPECT_TRUE(at::equal(actual.isnan(), expected.isnan()));
  EXPECT_TRUE(at::equal(actual.nan_to_num(0), expected.nan_to_num(0)))
      << "max abs diff " << (actual - expected).abs().nan_to_num(0).max().item<double>();
}

TEST_P(Relu, ForwardMatchesATenForAllDtypesAndShapes) {
  for (auto dtype : kDtypes) {
    for (const auto& shape : kShapes) {
      SCOPED_TRACE(testing::Message() << dtype << " " << at::IntArrayRef(shape));
      const at::Tensor x = random_with_special_values(shape, options(dtype));
      const at::Tensor y = fuseops::relu(x);
      expect_identical(y, at::relu(x));
      EXPECT_TRUE(y.is_contiguous());
    }
  }
}

TEST_P(Relu, BackwardMatchesThresholdBackward) {
  for (auto dtype : kDtypes) {
    for (const auto& shape : kShapes) {
      SCOPED_TRACE(testing::Message() << dtype << " " << at::IntArrayRef(shape));
      const at::Tensor result = at::relu(random_with_special_values(shape, options(dtype)));
      const at::Tensor grad = at::randn(shape, options(dtype));
      expect_identical(fuseops::relu_backward(grad, result),
                       at::threshold_backward(grad, result, 0));
    }
  }
}

TEST_P(Relu, NonContiguousInputs) {
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(testing::Message() << dtype);
    const at::Tensor base = at::randn({40, 70}, options(dtype));
    const at::Tensor transposed = base.t();
    const at::Tensor strided = base.slice(1, 1, 70, 3);
    const at::Tensor expanded = base.select(0, 0).expand({5, 70});
    for (const auto& x : {transposed, strided, expanded}) {
      ASSERT_FALSE(x.is_contiguous());
      expect_identical(fuseops::relu(x), at::relu(x));
      const at::Tensor grad = at::randn(x.sizes(), x.options()).t().contiguous().t();
      const at::Tensor result = at::relu(x);
      expect_identical(fuseops::relu_backward(grad.view(x.sizes()), result),
                       at::threshold_backward(grad.view(x.sizes()), result, 0));
    }
  }
}

TEST_P(Relu, AutogradInCpp) {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    const at::Tensor x = at::randn({13, 29}, options(dtype)).requires_grad_();
    const at::Tensor y = fuseops::relu(x);
    ASSERT_TRUE(y.requires_grad());
    const at::Tensor upstream = at::randn_like(y);
    y.backward(upstream);
    expect_identical(x.grad(), upstream * (x.detach() > 0).to(dtype));
  }
}

TEST_P(Relu, DoubleBackward) {
  const at::Tensor x = at::randn({9, 11}, options(at::kDouble)).requires_grad_();
  const at::Tensor upstream = at::randn({9, 11}, options(at::kDouble)).requires_grad_();
  const at::Tensor y = fuseops::relu(x);
  const auto grads = torch::autograd::grad({y}, {x}, {upstream}, /*retain_graph=*/true,
                                           /*create_graph=*/true);
  // d(grad_x)/d(upstream) is the relu mask.
  const at::Tensor w = at::randn({9, 11}, options(at::kDouble));
  const auto second = torch::autograd::grad({grads[0]}, {upstream}, {w});
  expect_identical(second[0], w * (x.detach() > 0).to(at::kDouble));
}

TEST_P(Relu, OutVariant) {
  const at::Tensor x = at::randn({6, 10}, options());
  at::Tensor out = at::empty({6, 10}, options());
  at::Tensor& returned = fuseops::relu_out(x, out);
  EXPECT_EQ(returned.data_ptr(), out.data_ptr());
  expect_identical(out, at::relu(x));

  // A non-contiguous out keeps its strides.
  at::Tensor out_t = at::empty({10, 6}, options()).t();
  fuseops::relu_out(x, out_t);
  EXPECT_FALSE(out_t.is_contiguous());
  expect_identical(out_t, at::relu(x));

  // A wrongly shaped out is resized.
  at::Tensor small = at::empty({0}, options());
  fuseops::relu_out(x, small);
  expect_identical(small, at::relu(x));

  // Partial overlap: out starts one element after input in the same buffer.
  at::Tensor buffer = at::randn({9}, options());
  const at::Tensor expected = at::relu(buffer.slice(0, 0, 8));
  at::Tensor shifted_out = buffer.slice(0, 1, 9);
  fuseops::relu_out(buffer.slice(0, 0, 8), shifted_out);
  expect_identical(shifted_out, expected);

  // Full alias: in place.
  at::Tensor y = x.clone();
  fuseops::relu_out(y, y);
  expect_identical(y, at::relu(x));
}

TEST(Relu, BadInputErrorsNameOpAndArgument) {
  expect_error_mentions([] { fuseops::relu(at::ones({3}, at::kInt)); },
                        {"fuseops::relu", "'input'", "Int"});
  expect_error_mentions([] { fuseops::relu(at::Tensor()); },
                        {"fuseops::relu", "'input'", "undefined"});
  expect_error_mentions([] { fuseops::relu_backward(at::ones({3}), at::ones({4})); },
                        {"fuseops::relu_backward", "'grad_output'", "shape"});
  expect_error_mentions([] { fuseops::relu_backward(at::ones({3}), at::ones({3}, at::kDouble)); },
                        {"fuseops::relu_backward", "'grad_output'", "dtype"});
  expect_error_mentions([] { fuseops::relu_backward(at::ones({3}), at::Tensor()); },
                        {"fuseops::relu_backward", "'result'", "undefined"});
  expect_error_mentions(
      [] {
        at::Tensor out = at::empty({3}, at::kDouble);
        fuseops::relu_out(at::ones({3}), out);
      },
      {"fuseops::relu.out", "'out'", "dtype"});
}

TEST(Relu, MetaTensorsGiveShapesOnly) {
  const at::Tensor x =
      at::empty({4, 5}, at::TensorOptions().device(at::kMeta).dtype(at::kBFloat16));
  const at::Tensor y = fuseops::relu(x);
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.sizes(), x.sizes());
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
}

// Called from many threads at once by threads_test.cpp.
FUSEOPS_THREADS_CASE(relu) { return {fuseops::relu(in.x)}; }

}  // namespace
