#pragma once
// rope's CPU kernel table: filled by each capability's build of
// rope_kernel.cpp, defined and registered with the dispatcher in rope.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/rope.h"

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(rope_kernel, detail::RopeKernel);
}  // namespace fuseops::cpu
