#pragma once
// decode_attention's CPU kernel table: filled by each capability's build of
// decode_attention_kernel.cpp, defined and registered in decode_attention.cpp.

#include "ops/cpu/dispatch.h"
#include "ops/decode_attention.h"

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(decode_attention_kernel, detail::DecodeAttentionKernel);
}  // namespace fuseops::cpu
