// The allocator behind fuseops' large CPU outputs; why it exists is in
// output_memory.h.

#include "ops/common/output_memory.h"

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <list>
#include <mutex>

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>
// ASAN_(UN)POISON_MEMORY_REGION: no-ops unless compiled with ASan.
#include <sanitizer/asan_interface.h>

namespace fuseops {
namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

std::size_t round_up_to_huge_page(std::size_t bytes) {
  return (bytes + kHugePage - 1) / kHugePage * kHugePage;
}

struct Block {
  void* ptr;
  std::size_t bytes;
};

class OutputAllocator final : public c10::Allocator {
 public:
  static OutputAllocator& instance();

  c10::DataPtr allocate(std::size_t n) override {
    if (n == 0) {
      return {nullptr, nullptr, &free_block, c10::Device(c10::DeviceType::CPU)};
    }
    const std::size_t bytes = round_up_to_huge_page(n);
    void* ptr = take_cached(bytes);
    if (ptr == nullptr) {
      ptr = map_block(bytes);
    }
    // ASan knows nothing of memory mapped here: mark what lies past the n
    // bytes asked for (up to 2 MiB) unaddressable, as malloc's redzones
    // would be, so that a kernel writing past its output is caught.
    ASAN_UNPOISON_MEMORY_REGION(ptr, n);
    ASAN_POISON_MEMORY_REGION(static_cast<char*>(ptr) + n, bytes - n);
    // Reported like PyTorch's own CPU allocator reports, so torch.profiler's
    // memory view sees fuseops outputs.
    c10::profiledCPUMemoryReporter().New(ptr, n);
    return {ptr, new Block{ptr, bytes}, &free_block, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  OutputMemoryStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void set_cache_limit(std::int64_t bytes) {
    TORCH_CHECK(bytes >= 0, "fuseops::set_output_cache_limit: argument 'bytes' must be >= 0, got ",
                bytes);
    std::list<Block> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.cache_limit = bytes;
      evict_above(bytes, evicted);
    }
    unmap_all(evicted);
  }

  void set_huge_pages(bool enabled) { huge_pages_.store(enabled, std::memory_order_relaxed); }

  // Whether outputs should come from here at all: without huge pages or a
  // cache a fresh mapping per output only loses to glibc, which reuses freed
  // blocks below its (dynamic, up to 32 MiB) mmap threshold.
  bool in_use() {
    if (huge_pages_.load(std::memory_order_relaxed)) {
      return true;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_.cache_limit > 0;
  }

  void release_cache() {
    std::list<Block> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      evict_above(0, evicted);
    }
    unmap_all(evicted);
  }

 private:
  static void free_block(void* context) {
    if (context == nullptr) {
      return;
    }
    auto* block = static_cast<Block*>(context);
    c10::profiledCPUMemoryReporter().Delete(block->ptr);
    instance().give_back(*block);
    delete block;
  }

  // Anonymous memory aligned to 2 MiB, so that it is made of whole huge
  // pages: map 2 MiB more than needed and unmap the unaligned ends.
  void* map_block(std::size_t bytes) {
    const std::size_t mapped = bytes + kHugePage;
    void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
      const int error = errno;
      c10::reportOutOfMemoryToProfiler(static_cast<std::int64_t>(bytes), 0, 0,
                                       c10::Device(c10::DeviceType::CPU));
      TORCH_CHECK_WITH(OutOfMemoryError, false, "fuseops: could not allocate ", bytes,
                       " bytes for an output: ", std::strerror(error));
    }
    const auto start = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
    if (aligned > start) {
      munmap(raw, aligned - start);
    }
    const std::uintptr_t end = start + mapped;
    if (end > aligned + bytes) {
      munmap(reinterpret_cast<void*>(aligned + bytes), end - (aligned + bytes));
    }
    void* ptr = reinterpret_cast<void*>(aligned);
    // Fails (EINVAL) where the kernel has no transparent huge pages; the
    // mapping then behaves like any other, so the result is ignored.
    const bool advised =
        huge_pages_.load(std::memory_order_relaxed) && madvise(ptr, bytes, MADV_HUGEPAGE) == 0;
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.allocations;
    stats_.huge_page_advised += advised ? 1 : 0;
    stats_.bytes_in_use += static_cast<std::int64_t>(bytes);
    return ptr;
  }

  void* take_cached(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->bytes == bytes) {
        void* ptr = it->ptr;
        cache_.erase(it);
        ++stats_.allocations;
        ++stats_.cache_hits;
        stats_.bytes_cached -= static_cast<std::int64_t>(bytes);
        stats_.bytes_in_use += static_cast<std::int64_t>(bytes);
        return ptr;
      }
    }
    return nullptr;
  }

  // A freed block joins the front of the cache (most recent first) if the
  // limit allows, pushing out the oldest blocks; otherwise it is unmapped.
  void give_back(const Block& block) {
    std::list<Block> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.bytes_in_use -= static_cast<std::int64_t>(block.bytes);
      if (static_cast<std::int64_t>(block.bytes) <= stats_.cache_limit) {
        evict_above(stats_.cache_limit - static_cast<std::int64_t>(block.bytes), evicted);
        // A cached block is freed memory: any use of it before it is handed
        // out again is a use after free.
        ASAN_POISON_MEMORY_REGION(block.ptr, block.bytes);
        cache_.push_front(block);
        stats_.bytes_cached += static_cast<std::int64_t>(block.bytes);
      } else {
        evicted.push_back(block);
      }
    }
    unmap_all(evicted);
  }

  // Caller holds mutex_.
  void evict_above(std::int64_t bound, std::list<Block>& evicted) {
    while (stats_.bytes_cached > bound) {
      evicted.splice(evicted.end(), cache_, std::prev(cache_.end()));
      stats_.bytes_cached -= static_cast<std::int64_t>(evicted.back().bytes);
    }
  }

  static void unmap_all(const std::list<Block>& blocks) {
    for (const Block& block : blocks) {
      // The address range may be mapped again by anyone: no stale marks.
      ASAN_UNPOISON_MEMORY_REGION(block.ptr, block.bytes);
      munmap(block.ptr, block.bytes);
    }
  }

  std::atomic<bool> huge_pages_{false};
  std::mutex mutex_;
  std::list<Block> cache_;  // most recently freed first
  OutputMemoryStats stats_;
};

OutputAllocator& OutputAllocator::instance() {
  // Never destroyed: storages allocated here may outlive static destruction.
  static auto* allocator = new OutputAllocator();
  return *allocator;
}

}  // namespace

namespace detail {

at::Tensor empty_output(c10::IntArrayRef sizes, const c10::TensorOptions& options) {
  const bool large_cpu =
      options.device().is_cpu() && !options.pinned_memory() && options.layout() == c10::kStrided &&
      static_cast<std::size_t>(c10::multiply_integers(sizes)) * options.dtype().itemsize() >=
          kLargeOutputBytes;
  if (!large_cpu || !OutputAllocator::instance().in_use()) {
    return at::empty(sizes, options);
  }
  return at::detail::empty_generic(sizes, &OutputAllocator::instance(),
                                   c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   options.dtype().toScalarType(), c10::MemoryFormat::Contiguous);
}

}  // namespace detail

OutputMemoryStats output_memory_stats() { return OutputAllocator::instance().stats(); }

void set_output_cache_limit(std::int64_t bytes) {
  OutputAllocator::instance().set_cache_limit(bytes);
}

void release_cached_output_memory() { OutputAllocator::instance().release_cache(); }

void set_output_huge_pages(bool enabled) { OutputAllocator::instance().set_huge_pages(enabled); }

}  // namespace fuseops
