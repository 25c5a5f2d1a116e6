#pragma once
// The 2:4 sparse linear family's CPU kernel table: filled by each
// capability's build of sparse_2_4_kernel.cpp, registered in sparse_2_4.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/sparse_2_4.h"

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(sparse_2_4_linear_kernel, detail::Sparse24LinearKernel);
FUSEOPS_DECLARE_CPU_KERNEL(sparse_2_4_dynamic_linear_kernel, detail::Sparse24DynamicLinearKernel);
}  // namespace fuseops::cpu
