#pragma once
// decode_attention's CPU kernel table: filled by each capability's build of
// decode_attention_kernel.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/decode_attention.h"

namespace fuseops::cpu {

struct DecodeAttentionCpuKernels {
  static inline constinit CpuKernelTable<detail::DecodeAttentionKernel> forward{
      "decode_attention_kernel"};
};

using DecodeAttentionCpuRegistrations =
    detail::DecodeAttentionRegistrations<DecodeAttentionCpuKernels>;

}  // namespace fuseops::cpu
