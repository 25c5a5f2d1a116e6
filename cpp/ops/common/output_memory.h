#pragma once
// Memory for the tensors fuseops returns on CPU.
//
// A fresh large tensor from PyTorch's CPU allocator is memory glibc maps anew
// for each call and returns to the system when it is freed, so every call
// pays a page fault (and the kernel zeroing a 4 KiB page) per 4 KiB of
// output: writing a new 64 MiB result costs several times what writing the
// same bytes into an existing tensor costs. fuseops therefore allocates its
// large CPU outputs (at least kLargeOutputBytes) itself:
//
// - aligned to 2 MiB, and, when asked (`set_output_huge_pages`), marked
//   MADV_HUGEPAGE, so where the system allows transparent huge pages first
//   touch faults once per 2 MiB instead of once per 4 KiB. Off by default:
//   with the common `defrag=madvise` setting a fault in such a region
//   compacts memory synchronously when no free huge page is at hand, and a
//   bench on a machine whose memory had been fragmented by a long test run
//   measured 8 MiB outputs taking ~10 ms instead of ~0.5 ms;
// - optionally, freed blocks are kept in a cache bounded in bytes and reused
//   by the next output of the same rounded size (already mapped and touched:
//   no faults at all). Off by default because it keeps memory the program
//   freed.
//
// With neither on, outputs come from at::empty as before: a fresh mapping per
// output would only lose to glibc, which reuses freed blocks below its
// dynamic mmap threshold (up to 32 MiB). `fuseops.cpu.tune_memory()` turns
// both on; fuseops/memory.h has the controls and statistics.
//
// Tensors allocated here are ordinary tensors: they free, resize, pickle and
// share with numpy like any other; only the allocator behind their storage
// differs. Small outputs and other devices use at::empty.

#include <cstddef>

#include <ATen/core/Tensor.h>
#include <fuseops/memory.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/ArrayRef.h>

namespace fuseops {
namespace detail {

// Outputs below this size come from PyTorch's allocator: one huge page is the
// smallest unit the huge-page path can save faults on.
constexpr std::size_t kLargeOutputBytes = std::size_t{2} << 20;

// A contiguous tensor of `sizes`: from the output allocator when it is a
// large CPU tensor and huge pages or the cache are on, from at::empty
// otherwise.
at::Tensor empty_output(c10::IntArrayRef sizes, const c10::TensorOptions& options);

}  // namespace detail

}  // namespace fuseops
