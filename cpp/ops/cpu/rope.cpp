// rope's CPU backend: its kernel table and its dispatcher registration.

#include "ops/cpu/rope.h"

#include <torch/library.h>

namespace fuseops::cpu {

FUSEOPS_DEFINE_CPU_KERNEL(rope_kernel, detail::RopeKernel);

namespace {

struct Kernels {
  static detail::RopeKernel rope() { return rope_kernel.get(); }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CPU, m) { detail::RopeRegistrations<Kernels>::register_all(m); }

}  // namespace fuseops::cpu
