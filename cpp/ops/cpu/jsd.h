#pragma once
// jsd's CPU kernel table: filled by each capability's build of
// jsd_kernel.cpp, defined and registered with the dispatcher in jsd.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/jsd.h"

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(jsd_rows_kernel, detail::JsdRowsKernel);
}  // namespace fuseops::cpu
