#pragma once
// The CPU kernel tables of rms_norm and fused_add_rms_norm: filled by each
// capability's build of rms_norm_kernel.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/rms_norm.h"

namespace fuseops::cpu {

struct RmsNormCpuKernels {
  static inline constinit CpuKernelTable<detail::RmsNormForwardKernel> forward{
      "rms_norm_forward_kernel"};
  static inline constinit CpuKernelTable<detail::RmsNormBackwardKernel> backward{
      "rms_norm_backward_kernel"};
};

using RmsNormCpuRegistrations = detail::RmsNormRegistrations<RmsNormCpuKernels>;

}  // namespace fuseops::cpu
