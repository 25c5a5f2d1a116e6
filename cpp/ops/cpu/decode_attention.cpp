// decode_attention's CPU backend: its kernel table and its dispatcher
// registration.

#include "ops/cpu/decode_attention.h"

#include <torch/library.h>

namespace fuseops::cpu {

FUSEOPS_DEFINE_CPU_KERNEL(decode_attention_kernel, detail::DecodeAttentionKernel);

namespace {

struct Kernels {
  static detail::DecodeAttentionKernel forward() { return decode_attention_kernel.get(); }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CPU, m) {
  detail::DecodeAttentionRegistrations<Kernels>::register_all(m);
}

}  // namespace fuseops::cpu
