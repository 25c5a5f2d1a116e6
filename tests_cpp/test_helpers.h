#pragma once
// Helpers shared by the GoogleTest files.

#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <fuseops/build_info.h>

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

// Why the CUDA runs of the op tests cannot run here; empty where they can.
inline std::string cuda_unavailable_reason() {
  if (!fuseops::build_info().cuda) {
    return "this libfuseops was built without CUDA kernels";
  }
  if (!torch::cuda::is_available()) {
    return "torch sees no CUDA device";
  }
  return "";
}

// The fixture of an op's tests that run on every device: write them as
// TEST_P(Suite, Name) with `class Suite : public DeviceTest {};` and
// FUSEOPS_TEST_ON_DEVICES(Suite), and make their tensors with options().
// Each runs as OnDevice/Suite.Name/cpu and OnDevice/Suite.Name/cuda; a CUDA
// run that cannot run here is reported as skipped, with the reason.
class DeviceTest : public ::testing::TestWithParam<at::DeviceType> {
 protected:
  void SetUp() override {
    if (GetParam() == at::kCUDA) {
      const std::string reason = cuda_unavailable_reason();
      if (!reason.empty()) {
        GTEST_SKIP() << "CUDA run skipped: " << reason;
      }
    }
    // Each test draws the inputs it draws under ctest (one process per
    // test, the generator at its default seed) also when one process runs
    // them all (the sanitizer step), whatever ran before it.
    at::manual_seed(c10::default_rng_seed_val);
  }

  at::Device device() const { return at::Device(GetParam()); }

  at::TensorOptions options(at::ScalarType dtype = at::kFloat) const {
    return at::TensorOptions().dtype(dtype).device(device());
  }
};

inline std::string device_name(const ::testing::TestParamInfo<at::DeviceType>& info) {
  return info.param == at::kCUDA ? "cuda" : "cpu";
}

}  // namespace fuseops::testing

#define FUSEOPS_TEST_ON_DEVICES(Suite)                                              \
  INSTANTIATE_TEST_SUITE_P(OnDevice, Suite, ::testing::Values(at::kCPU, at::kCUDA), \
                           ::fuseops::testing::device_name)
