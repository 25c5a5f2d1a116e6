// An undefined Tensor for a required argument of the C++ API is refused by
// the op's own checks, which name the op and the argument, on whatever path
// the call takes (the Autograd kernel's checks, the refusing kernel's, or the
// entry point's below it). The C++ API adds no check of its own.

#include <functional>
#include <string>

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fuseops/fuseops.h>

#include "test_helpers.h"

namespace {

using fuseops::testing::expect_error_mentions;

struct UndefinedArgument {
  std::string op;
  std::string argument;
  std::function<void()> call;
};

TEST(UndefinedArgument, IsNamedWithItsOp) {
  const at::Tensor r = at::randn({2, 8});
  const at::Tensor u;
  const at::Tensor target = at::zeros({2}, at::kLong);
  const std::vector<UndefinedArgument> cases = {
      {"fuseops::dequantize_int8", "q", [&] { fuseops::dequantize_int8(u, at::ones({2})); }},
      {"fuseops::quantize_per_token_int8", "input", [&] { fuseops::quantize_per_token_int8(u); }},
      {"fuseops::pack_int4_weight", "wq", [&] { fuseops::pack_int4_weight(u, u, u, 128); }},
      {"fuseops::int8_weight_only_linear", "packed",
       [&] { fuseops::int8_weight_only_linear(r, u, at::ones({4})); }},
      {"fuseops::sparse_2_4_linear", "meta",
       [&] { fuseops::sparse_2_4_linear(r, at::ones({4, 4}), u, at::ones({4})); }},
      {"fuseops::cross_entropy", "target", [&] { fuseops::cross_entropy(r, u); }},
      {"fuseops::cross_entropy_backward", "lse",
       [&] {
         fuseops::cross_entropy_backward(at::ones({}), r, target, std::nullopt, u, at::ones({}),
                                         "mean", -100, 0, 0, std::nullopt);
       }},
      {"fuseops::jsd_backward", "row_stats",
       [&] {
         fuseops::jsd_backward(at::ones({}), r, r, std::nullopt, u, 0.5, 1.0, -100, "batchmean");
       }},
      {"fuseops::rope.single", "cos",
       [&] { fuseops::rope_single(at::randn({1, 2, 2, 4}), u, at::ones({2, 2})); }},
      {"fuseops::rms_norm_backward", "rstd",
       [&] { fuseops::rms_norm_backward(r, r, std::nullopt, u); }},
  };
  for (const UndefinedArgument& c : cases) {
    SCOPED_TRACE(c.op);
    expect_error_mentions(c.call, {c.op + ": argument '" + c.argument +
                                   "' must be a defined tensor, got an undefined tensor"});
  }
}

}  // namespace
