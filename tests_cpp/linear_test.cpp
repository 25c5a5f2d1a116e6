// fuseops::linear through the dispatcher, against the product in float64,
// in every CPU build this CPU runs: the few-row kernel (up to
// fuseops::kLinearStreamRows rows, every register tiling and a K that is
// no multiple of the vector width) and ATen's product beyond; gradients
// through the C++ autograd; bad inputs.

#include <cmath>
#include <cstdlib>
#include <optional>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <fuseops/fuseops.h>

#include "ops/cpu/dispatch.h"
#include "test_helpers.h"

namespace {

using fuseops::testing::expect_error_mentions;
using fuseops::testing::reduction_tolerance;

class Linear : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(Linear);

at::Tensor reference(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b) {
  at::Tensor y = at::matmul(x.to(at::kDouble), w.to(at::kDouble).t());
  return b ? y + b->to(at::kDouble) : y;
}

TEST_P(Linear, MatchesFloat64InEveryBuild) {
  struct Case {
    int64_t rows, k, n;
    bool bias;
  };
  for (auto dtype : fuseops::testing::kDtypes) {
    for (const Case& c : std::vector<Case>{{1, 256, 40, true},
                                           {2, 4100, 40, false},
                                           {3, 37, 19, false},
                                           {4, 300, 64, true},
                                           {5, 64, 33, true},
                                           {13, 129, 18, false},
                                           {16, 70, 16, true},
                                           {17, 96, 24, true},
                                           {64, 48, 20, false}}) {
      const at::Tensor x = at::randn({c.rows, c.k}, options()).to(dtype);
      const at::Tensor w = at::randn({c.n, c.k}, options()).to(dtype);
      std::optional<at::Tensor> b;
      if (c.bias) {
        b = at::randn({c.n}, options()).to(dtype);
      }
      const at::Tensor want = reference(x, w, b);
      for (auto capability : fuseops::cpu::runnable_capabilities()) {
        fuseops::cpu::ScopedCapabilityOverride forced(capability);
        SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype
                                        << " rows " << c.rows << " k " << c.k << " n " << c.n);
        const at::Tensor y = fuseops::linear(x, w, b);
        ASSERT_EQ(y.scalar_type(), dtype);
        ASSERT_EQ(y.sizes(), want.sizes());
        // Sums of K products of magnitude ~1 (size ~sqrt(K)): float32
        // accumulation, or the bfloat16/float16 rounding of the output.
        const double tol = reduction_tolerance(dtype) * std::sqrt(double(c.k));
        EXPECT_TRUE(at::allclose(y.to(at::kDouble), want, reduction_tolerance(dtype), tol))
            << (y.to(at::kDouble) - want).abs().max().item<double>();
      }
    }
  }
}

// Where ATen emulates bfloat16/float16 products (forced here through the
// environment, so that every CPU runs it) the kernel streams up to
// fuseops::kLinearStreamRowsEmulated rows: each row has the bits it has
// alone (the one-row call always streams), and matches float64.
TEST_P(Linear, StreamsMoreReducedRowsWhereAtenEmulatesThem) {
  if (device().is_cuda()) {
    GTEST_SKIP() << "a CPU kernel's row limit";
  }
  struct EnvGuard {
    EnvGuard() { setenv("FUSEOPS_REDUCED_GEMMS", "emulated", 1); }
    ~EnvGuard() { unsetenv("FUSEOPS_REDUCED_GEMMS"); }
  } emulated;
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    for (int64_t rows = fuseops::kLinearStreamRows + 1; rows <= fuseops::kLinearStreamRowsEmulated;
         ++rows) {
      const at::Tensor x = at::randn({rows, 1030}, options()).to(dtype);
      const at::Tensor w = at::randn({37, 1030}, options()).to(dtype);
      const at::Tensor b = at::randn({37}, options()).to(dtype);
      const at::Tensor want = reference(x, w, b);
      for (auto capability : fuseops::cpu::runnable_capabilities()) {
        fuseops::cpu::ScopedCapabilityOverride forced(capability);
        SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype
                                        << " rows " << rows);
        const at::Tensor y = fuseops::linear(x, w, b);
        const double tol = reduction_tolerance(dtype) * std::sqrt(1030.0);
        EXPECT_TRUE(at::allclose(y.to(at::kDouble), want, reduction_tolerance(dtype), tol));
        for (int64_t r = 0; r < rows; ++r) {
          ASSERT_TRUE(at::equal(fuseops::linear(x.narrow(0, r, 1), w, b), y.narrow(0, r, 1)))
              << "row " << r;
        }
      }
    }
  }
}

TEST_P(Linear, KeepsLeadingDimensionsAndEmptySums) {
  const at::Tensor x = at::randn({2, 3, 8}, options());
  const at::Tensor w = at::randn({5, 8}, options());
  const at::Tensor y = fuseops::linear(x, w);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 3, 5}));
  EXPECT_TRUE(at::allclose(y.to(at::kDouble), reference(x, w, std::nullopt), 1e-5, 1e-5));
  // K = 0: the bias alone.
  const at::Tensor b = at::randn({5}, options());
  const at::Tensor y0 =
      fuseops::linear(at::randn({4, 0}, options()), at::randn({5, 0}, options()), b);
  EXPECT_TRUE(at::equal(y0, b.expand({4, 5})));
}

TEST(Linear, GradientsMatchTheProductsInFloat64) {
  const at::Tensor x = at::randn({3, 2, 24}, at::kDouble).requires_grad_();
  const at::Tensor w = at::randn({10, 24}, at::kDouble).requires_grad_();
  const at::Tensor b = at::randn({10}, at::kDouble).requires_grad_();
  const at::Tensor g = at::randn({3, 2, 10}, at::kDouble);
  const auto got = torch::autograd::grad({fuseops::linear(x, w, b)}, {x, w, b}, {g});
  const auto want = torch::autograd::grad({at::linear(x, w, b)}, {x, w, b}, {g});
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(at::allclose(got[i], want[i], 1e-12, 1e-12)) << "gradient " << i;
  }
}

TEST(Linear, RefusesBadInputs) {
  const char* op = "fuseops::linear";
  const at::Tensor x = at::randn({2, 8});
  const at::Tensor w = at::randn({4, 8});
  expect_error_mentions([&] { fuseops::linear(x, at::randn({4, 7})); }, {op, "'weight'", "8"});
  expect_error_mentions([&] { fuseops::linear(x, at::randn({8})); }, {op, "'weight'", "2-D"});
  expect_error_mentions([&] { fuseops::linear(x, w.to(at::kDouble)); }, {op, "'weight'", "dtype"});
  expect_error_mentions([&] { fuseops::linear(x, w, at::randn({5})); }, {op, "'bias'", "[4]"});
  expect_error_mentions([&] { fuseops::linear(at::randn({}), w); }, {op, "'input'"});
  expect_error_mentions([&] { fuseops::linear(x.to(at::kInt), w); }, {op, "'input'"});
}

}  // namespace
