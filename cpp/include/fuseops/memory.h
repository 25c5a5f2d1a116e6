#pragma once
// How fuseops allocates the large CPU tensors it returns, and the switch for
// its cache of freed blocks (see cpp/ops/common/output_memory.h for why).

#include <cstdint>

namespace fuseops {

// Process-wide statistics of the output allocator; bytes count whole 2 MiB
// blocks.
struct OutputMemoryStats {
  std::int64_t allocations = 0;        // blocks handed out
  std::int64_t cache_hits = 0;         // of those, reused from the cache
  std::int64_t huge_page_advised = 0;  // new mappings marked MADV_HUGEPAGE
  std::int64_t bytes_in_use = 0;       // blocks held by live tensors
  std::int64_t bytes_cached = 0;       // freed blocks kept for reuse
  std::int64_t cache_limit = 0;        // bound of bytes_cached (0: cache off)
};

OutputMemoryStats output_memory_stats();

// Bounds the cache of freed output blocks to `bytes` (0, the default, turns it
// off) and returns cached blocks above the new bound to the system.
void set_output_cache_limit(std::int64_t bytes);

// Returns every cached block to the system (the limit stays).
void release_cached_output_memory();

// Whether new output blocks are marked MADV_HUGEPAGE (off by default: where
// the system compacts memory synchronously for such regions, a fault can
// stall for milliseconds when no free huge page is at hand, which costs more
// than the faults it saves unless freed blocks are reused from the cache).
void set_output_huge_pages(bool enabled);

}  // namespace fuseops
