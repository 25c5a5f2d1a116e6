#pragma once
// Software prefetch for the kernels that stream a weight from memory once
// (the linear products of a decode step). With a row or two of activations,
// each weight byte carries little arithmetic but its widening (bfloat16,
// int8 or int4 to float32), and those instructions fill the out-of-order
// window before enough loads are in flight: on one core the hardware
// prefetcher alone then keeps too few cache lines coming from DRAM. A
// prefetch a fixed distance ahead of each stream's loads keeps them coming
// (measured on a 2-core Xeon: bfloat16 rows read at 13 GB/s without, 18-22
// GB/s with, float32 rows 20-25 GB/s either way).

#include <cstdint>

#include <c10/macros/Macros.h>

namespace fuseops::cpu {

// How far ahead of the current read of a stream to prefetch.
inline constexpr int64_t kStreamPrefetchBytes = 1024;

// Asks for the cache line kAhead bytes past `p`. A prefetch never faults,
// so past the end of the stream it costs nothing but the hint.
template <int64_t kAhead = kStreamPrefetchBytes>
C10_ALWAYS_INLINE void prefetch_ahead(const void* p) {
  __builtin_prefetch(static_cast<const char*>(p) + kAhead, 0, 3);
}

// Asks for the cache line at `p` into L2 (linear's prefetch of the next
// stripe of weight rows, a whole stripe ahead: too far for L1).
C10_ALWAYS_INLINE void prefetch_into_l2(const void* p) { __builtin_prefetch(p, 0, 2); }

}  // namespace fuseops::cpu
