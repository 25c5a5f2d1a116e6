// Every compiled CPU build of the kernels (DEFAULT, AVX2, AVX512) gives the
// same results as ATen. The override forces each build in turn inside this
// process; the selected build is lowered to what this CPU can run.

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
  EXPECT_EQ(fuseops::build_info().selected_cpu_capability,
            fuseops::cpu::capability_name(selected));
}

TEST(CpuCapability, OverrideSelectsEachBuild) {
  for (auto capability : fuseops::cpu::compiled_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    EXPECT_LE(static_cast<int>(fuseops::cpu::selected_capability()),
              static_cast<int>(capability));
  }
}

TEST(CpuCapability, EveryBuildMatchesATen) {
  for (auto capability : fuseops::cpu::compiled_capabilities()) {
    fuseops::cpu::ScopedCapabilityOverride force(capability);
    for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " "
                                      << dtype);
      // 100003: several parallel chunks and a tail shorter than any vector.
      const at::Tensor x = at::randn({100003}, at::TensorOptions().dtype(dtype));
      const at::Tensor y = fuseops::relu(x);
      EXPECT_TRUE(at::equal(y, at::relu(x)));
      const at::Tensor grad = at::randn_like(x);
      EXPECT_TRUE(at::equal(fuseops::relu_backward(grad, y),
                            at::threshold_backward(grad, y, 0)));
    }
  }
}

}  // namespace
