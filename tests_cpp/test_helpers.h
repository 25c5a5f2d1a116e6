#pragma once
// Helpers shared by the GoogleTest files.

#include <functional>
#include <string>
#include <utility>
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

// Relative tolerance of a linear layer's output, taken against max|y|:
// products summed in float32 over K terms err by about K * 2^-24 of the sum
// of |terms| at worst, which 1e-5 of max|y| covers for K up to a few
// thousand; bfloat16/float16 outputs are rounded once more (two units in
// their last place, as elementwise_tolerance).
inline double linear_tolerance(at::ScalarType dtype) { return elementwise_tolerance(dtype); }

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

// The threads test's inputs (threads_test.cpp): x and g [257, 131], w [131],
// target [257] of class indices below 131, in float32 or bfloat16.
struct ThreadsInputs {
  at::Tensor x;
  at::Tensor w;
  at::Tensor g;
  at::Tensor target;
};

// An op family's calls on the threads test's inputs. Each family declares its
// own beside its tests (FUSEOPS_THREADS_CASE); threads_test.cpp makes them from
// many threads at once and requires the one-thread results bit for bit. A
// case computes only from its inputs (it runs concurrently with itself).
using ThreadsCase = std::vector<at::Tensor> (*)(const ThreadsInputs&);

inline std::vector<std::pair<std::string, ThreadsCase>>& threads_cases() {
  static std::vector<std::pair<std::string, ThreadsCase>> cases;
  return cases;
}

}  // namespace fuseops::testing

#define FUSEOPS_TEST_ON_DEVICES(Suite)                                              \
  INSTANTIATE_TEST_SUITE_P(OnDevice, Suite, ::testing::Values(at::kCPU, at::kCUDA), \
                           ::fuseops::testing::device_name)

// Declares an op family's threads case (see ThreadsCase), followed by its body:
//   FUSEOPS_THREADS_CASE(rms_norm) { return {fuseops::rms_norm(in.x, in.w, 1e-6)}; }
#define FUSEOPS_THREADS_CASE(name)                                                           \
  std::vector<at::Tensor> name##_threads_case(const ::fuseops::testing::ThreadsInputs& in);  \
  static const bool name##_threads_case_registered =                                         \
      (::fuseops::testing::threads_cases().emplace_back(#name, &name##_threads_case), true); \
  std::vector<at::Tensor> name##_threads_case(const ::fuseops::testing::ThreadsInputs& in)
