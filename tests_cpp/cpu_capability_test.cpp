// The CPU build selection, and relu exact on every build this CPU runs. The
// override forces each build in turn inside this process; the kernel call
// counters prove which build ran.

#include <algorithm>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fuseops/fuseops.h>

#include "ops/cpu/dispatch.h"

namespace {

using fuseops::cpu::CpuCapability;

TEST(CpuCapability, ATenChoiceIsHonouredAndBounded) {
  const auto compiled = fuseops::cpu::compiled_capabilities();
  ASSERT_FALSE(compiled.empty());
  EXPECT_EQ(compiled.front(), CpuCapability::DEFAULT);
  const auto selected = fuseops::cpu::selected_capability();
  EXPECT_LE(static_cast<int>(selected), static_cast<int>(compiled.back()));
  const std::string aten = at::get_cpu_capability();
  if (aten == "DEFAULT") {
    EXPECT_EQ(selected, CpuCapability::DEFAULT);
  }
  EXPECT_EQ(fuseops::build_info().selected_cpu_capability, fuseops::cpu::capability_name(selected));
}

TEST(CpuCapability, EveryRunnableBuildRunsWhenForced) {
  const auto runnable = fuseops::cpu::runnable_capabilities();
  ASSERT_FALSE(runnable.empty());
  EXPECT_EQ(runnable.front(), CpuCapability::DEFAULT);
  const at::Tensor x = at::randn({100});
  for (auto capability : runnable) {
    SCOPED_TRACE(fuseops::cpu::capability_name(capability));
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    EXPECT_EQ(fuseops::cpu::selected_capability(), capability);
    const auto before = fuseops::cpu::kernel_calls();
    fuseops::relu(x);
    const auto after = fuseops::cpu::kernel_calls();
    for (int cap = 0; cap < fuseops::cpu::kNumCpuCapabilities; ++cap) {
      EXPECT_EQ(after[cap] - before[cap], cap == static_cast<int>(capability) ? 1u : 0u);
    }
  }
}

TEST(CpuCapability, ForcingABuildThatCannotRunIsRefused) {
  const auto runnable = fuseops::cpu::runnable_capabilities();
  const auto before = fuseops::cpu::selected_capability();
  int refused = 0;
  for (auto capability : {CpuCapability::DEFAULT, CpuCapability::AVX2, CpuCapability::AVX512}) {
    if (std::find(runnable.begin(), runnable.end(), capability) != runnable.end()) {
      continue;
    }
    SCOPED_TRACE(fuseops::cpu::capability_name(capability));
    try {
      fuseops::cpu::ScopedCapabilityOverride force(capability);
      ADD_FAILURE() << "forcing a build that cannot run was accepted";
    } catch (const c10::Error& e) {
      const std::string message = e.what_without_backtrace();
      EXPECT_NE(message.find(std::string("cannot force the ") +
                             fuseops::cpu::capability_name(capability) + " CPU kernels"),
                std::string::npos)
          << message;
      EXPECT_NE(message.find("Force one of fuseops::cpu::runnable_capabilities() (here: DEFAULT"),
                std::string::npos)
          << message;
    }
    EXPECT_EQ(fuseops::cpu::selected_capability(), before);
    ++refused;
  }
  if (refused == 0) {
    GTEST_SKIP() << "this CPU runs every build and this library has all of them";
  }
}

// relu's value and gradient are exact: x where x > 0 or x is NaN, else 0.
// NaN, +-Inf and -0 among random values in every dtype and build: torch
// 2.13's AVX-512 Vectorized<Half>/<BFloat16> maximum loses NaN and changes
// the neighbouring lanes, which this kernel once used.
TEST(CpuCapability, ReluIsExactOnEveryBuildSpecialValuesIncluded) {
  const double inf = std::numeric_limits<double>::infinity();
  const at::Tensor specials =
      at::tensor({std::numeric_limits<double>::quiet_NaN(), 1.0, 2.0, inf, -inf, -0.0, -1.0});
  for (auto capability : fuseops::cpu::runnable_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype);
      // 100003: several parallel chunks and a tail shorter than any vector.
      at::Tensor x = at::randn({100003}, at::TensorOptions().dtype(dtype));
      at::Tensor every_7th = x.slice(0, 0, c10::nullopt, 7);
      every_7th.copy_(specials.repeat({every_7th.numel() / specials.numel() + 1})
                          .slice(0, 0, every_7th.numel()));
      const at::Tensor passes = x.gt(0).logical_or(x.isnan());
      const at::Tensor y = fuseops::relu(x);
      EXPECT_TRUE(at::equal(y.isnan(), x.isnan()));
      EXPECT_TRUE(at::equal(y.nan_to_num(0, inf, -inf),
                            at::where(passes, x, at::zeros_like(x)).nan_to_num(0, inf, -inf)));
      const at::Tensor grad = at::randn_like(x);
      EXPECT_TRUE(at::equal(fuseops::relu_backward(grad, y),
                            at::where(passes, grad, at::zeros_like(grad))));
    }
  }
}

}  // namespace
