#pragma once
// linear's CPU kernel table: filled by each capability's build of
// linear_kernel.cpp, defined and registered in linear.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/linear.h"

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(linear_kernel, detail::LinearKernel);
}  // namespace fuseops::cpu
