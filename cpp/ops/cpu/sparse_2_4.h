#pragma once
// The 2:4 sparse linear family's CPU kernel table: filled by each
// capability's build of sparse_2_4_kernel.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/sparse_2_4.h"

namespace fuseops::cpu {

struct Sparse24CpuKernels {
  static inline constinit CpuKernelTable<detail::Sparse24LinearKernel> linear{
      "sparse_2_4_linear_kernel"};
  static inline constinit CpuKernelTable<detail::Sparse24DynamicLinearKernel> dynamic{
      "sparse_2_4_dynamic_linear_kernel"};
};

using Sparse24CpuRegistrations = detail::Sparse24Registrations<Sparse24CpuKernels>;

}  // namespace fuseops::cpu
