// The allocator behind fuseops' large CPU outputs (cpp/ops/common/
// output_memory.h): 2 MiB alignment, blocks returned on free, the bounded
// cache, tensors that behave like any other, and many threads at once.

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fuseops/fuseops.h>

#include <sanitizer/asan_interface.h>

namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

// The allocator serves outputs once huge pages (or the cache) are on; every
// test leaves the process as it found it: both off, cache empty.
class OutputMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    fuseops::set_output_cache_limit(0);
    fuseops::set_output_huge_pages(true);
  }
  void TearDown() override {
    fuseops::set_output_cache_limit(0);
    fuseops::set_output_huge_pages(false);
  }
};

TEST(OutputMemoryOff, ByDefaultOutputsComeFromPyTorch) {
  const auto before = fuseops::output_memory_stats();
  const at::Tensor y = fuseops::relu(at::randn({1 << 20}));
  EXPECT_EQ(fuseops::output_memory_stats().allocations, before.allocations);
}

bool huge_page_aligned(const at::Tensor& t) {
  return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % (2 * kMiB) == 0;
}

TEST_F(OutputMemory, LargeOutputsAreWholeHugePagesAndFreedOnRelease) {
  const auto before = fuseops::output_memory_stats();
  // 3 MiB + 4 bytes: rounds up to two 2 MiB blocks.
  const at::Tensor x = at::randn({3 * kMiB / 4 + 1});
  {
    const at::Tensor y = fuseops::relu(x);
    EXPECT_TRUE(huge_page_aligned(y));
    EXPECT_TRUE(at::equal(y, at::relu(x)));
    const auto during = fuseops::output_memory_stats();
    EXPECT_EQ(during.allocations, before.allocations + 1);
    EXPECT_EQ(during.bytes_in_use, before.bytes_in_use + 4 * kMiB);
  }
  const auto after = fuseops::output_memory_stats();
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.bytes_cached, 0);
}

TEST_F(OutputMemory, SmallOutputsComeFromPyTorch) {
  const auto before = fuseops::output_memory_stats();
  const at::Tensor y = fuseops::relu(at::randn({2 * kMiB / 4 - 1}));
  EXPECT_EQ(fuseops::output_memory_stats().allocations, before.allocations);
  EXPECT_EQ(y.numel(), 2 * kMiB / 4 - 1);
}

TEST_F(OutputMemory, CacheReusesFreedBlocksWithinItsLimit) {
  fuseops::set_output_cache_limit(8 * kMiB);
  const at::Tensor x = at::randn({kMiB});  // 4 MiB
  void* first = nullptr;
  {
    const at::Tensor y = fuseops::relu(x);
    first = y.data_ptr();
  }
  EXPECT_EQ(fuseops::output_memory_stats().bytes_cached, 4 * kMiB);
  const auto before = fuseops::output_memory_stats();
  const at::Tensor again = fuseops::relu(x);
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(fuseops::output_memory_stats().cache_hits, before.cache_hits + 1);
  // Reused memory holds the old values; the result must not depend on them.
  EXPECT_TRUE(at::equal(again, at::relu(x)));
  {
    // 12 MiB: over the limit, so unmapped on free rather than cached.
    const at::Tensor big = fuseops::relu(at::randn({3 * kMiB}));
  }
  EXPECT_LE(fuseops::output_memory_stats().bytes_cached, 8 * kMiB);
  fuseops::release_cached_output_memory();
  EXPECT_EQ(fuseops::output_memory_stats().bytes_cached, 0);
}

#if defined(__SANITIZE_ADDRESS__)
// ASan does not see the mappings this allocator hands out; the allocator
// marks what an output does not own (the rest of its 2 MiB-rounded block,
// and cached blocks, which are freed memory) so that ASan catches a kernel
// writing past its output or a use after free.
TEST_F(OutputMemory, AddressSanitizerSeesPastTheOutputAndIntoCachedBlocks) {
  fuseops::set_output_cache_limit(8 * kMiB);
  // 3 MiB + 4 bytes in a 4 MiB block.
  const at::Tensor x = at::randn({3 * kMiB / 4 + 1});
  char* start = nullptr;
  {
    const at::Tensor y = fuseops::relu(x);
    start = static_cast<char*>(y.data_ptr());
    EXPECT_EQ(__asan_region_is_poisoned(start, y.nbytes()), nullptr);
    EXPECT_TRUE(__asan_address_is_poisoned(start + y.nbytes()));
    EXPECT_TRUE(__asan_address_is_poisoned(start + 4 * kMiB - 1));
  }
  EXPECT_EQ(fuseops::output_memory_stats().bytes_cached, 4 * kMiB);
  EXPECT_TRUE(__asan_address_is_poisoned(start));
  EXPECT_TRUE(__asan_address_is_poisoned(start + 2 * kMiB));
  {
    // Handed out again: addressable up to its new size only.
    const at::Tensor y = fuseops::relu(at::randn({kMiB / 2 + 3}));
    EXPECT_EQ(static_cast<char*>(y.data_ptr()), start);
    EXPECT_EQ(__asan_region_is_poisoned(start, y.nbytes()), nullptr);
    EXPECT_TRUE(__asan_address_is_poisoned(start + y.nbytes()));
  }
  fuseops::release_cached_output_memory();
}
#endif

TEST_F(OutputMemory, NegativeCacheLimitIsRefused) {
  try {
    fuseops::set_output_cache_limit(-1);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'bytes'"), std::string::npos) << e.what();
  }
}

TEST_F(OutputMemory, ResizeKeepsData) {
  const at::Tensor x = at::randn({kMiB});
  at::Tensor y = fuseops::relu(x);
  const at::Tensor expected = at::relu(x);
  y.resize_({3 * kMiB});  // grows the storage through the same allocator
  EXPECT_TRUE(at::equal(y.slice(0, 0, kMiB), expected));
  y.resize_({10});
  EXPECT_TRUE(at::equal(y, expected.slice(0, 0, 10)));
}

TEST_F(OutputMemory, ManyThreadsAllocateAndFreeAtOnce) {
  // A cache smaller than what the threads hold at once forces evictions
  // while other threads take and return blocks.
  fuseops::set_output_cache_limit(10 * kMiB);
  const auto before = fuseops::output_memory_stats();
  constexpr int kThreads = 8;
  constexpr int kIterations = 40;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &failures] {
      for (int i = 0; i < kIterations; ++i) {
        const std::int64_t numel = (1 + (t + i) % 3) * kMiB / 2 + t;  // 2..6 MiB, odd sizes
        const at::Tensor x = at::full({numel}, static_cast<float>(i % 5) - 2.0f);
        const at::Tensor y = fuseops::relu(x);
        const float expected = std::max(static_cast<float>(i % 5) - 2.0f, 0.0f);
        if (y[0].item<float>() != expected || y[numel - 1].item<float>() != expected) {
          ++failures[t];
        }
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], 0) << "thread " << t;
  }
  const auto after = fuseops::output_memory_stats();
  EXPECT_EQ(after.allocations, before.allocations + kThreads * kIterations);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_LE(after.bytes_cached, 10 * kMiB);
}

}  // namespace
