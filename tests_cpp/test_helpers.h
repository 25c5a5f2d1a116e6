#pragma once
// Helpers shared by the GoogleTest files.

#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace fuseops::testing {

// Seeds ATen's default generator (otherwise seeded from the OS, different
// every run) when the test program starts, so every run draws the same
// inputs and a failure reproduces.
inline const bool kSeeded = (at::manual_seed(0), true);

// Every floating dtype the ops accept.
inline const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kBFloat16,
                                                    at::kHalf};

// Relative tolerance of an elementwise result computed in float32 (float64
// for double) and rounded once: two units in the last place of bfloat16 and
// float16, 1e-5 (a few float32 ulp of the math library) otherwise.
inline double elementwise_tolerance(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16:
      return 2.0 / 256;
    case at::kHalf:
      return 2.0 / 2048;
    default:
      return 1e-5;
  }
}

// Relative tolerance of a result that sums over a row or a window in
// float32 (float64 for double) and is rounded once: a few units in the last
// place of bfloat16 (2^-8) and float16 (2^-11) for the rounding, 1e-5 for
// float32 sums of up to ~10^4 terms.
inline double reduction_tolerance(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16:
      return 1e-2;
    case at::kHalf:
      return 2e-3;
    default:
      return 1e-5;
  }
}

// Largest magnitude in `t` (1 for an empty tensor): the scale of absolute floors.
inline double absmax(const at::Tensor& t) {
  return t.numel() == 0 ? 1.0 : t.abs().max().item<double>();
}

// Expects `call` to throw a c10::Error whose message contains every one of
// `fragments` (the op's name, the argument's name, what is wrong).
inline void expect_error_mentions(const std::function<void()>& call,
                                  const std::vector<std::string>& fragments) {
  try {
    call();
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    for (const auto& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "'" << fragment << "' not in: " << message;
    }
  }
}

}  // namespace fuseops::testing
