#pragma once
// jsd's CPU kernel table: filled by each capability's build of
// jsd_kernel.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/jsd.h"

namespace fuseops::cpu {

struct JsdCpuKernels {
  static inline constinit CpuKernelTable<detail::JsdRowsKernel> rows{"jsd_rows_kernel"};
};

using JsdCpuRegistrations = detail::JsdRegistrations<JsdCpuKernels>;

}  // namespace fuseops::cpu
