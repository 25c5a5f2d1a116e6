#pragma once
// The CPU kernel tables of moe_experts: filled by each capability's build of
// moe_experts_kernel.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/moe_experts.h"

namespace fuseops::cpu {

struct MoeExpertsCpuKernels {
  static inline constinit CpuKernelTable<detail::MoeExpertsKernel> forward{"moe_experts_kernel"};
  static inline constinit CpuKernelTable<detail::MoeExpertsBackwardKernel> backward{
      "moe_experts_backward_kernel"};
};

using MoeExpertsCpuRegistrations = detail::MoeExpertsRegistrations<MoeExpertsCpuKernels>;

}  // namespace fuseops::cpu
