#pragma once
// Parallel, vectorized elementwise maps over contiguous buffers, for kernel
// files compiled per CPU capability. bfloat16/float16 are computed in float32
// (at::vec::map converts through float), float64 in double.

#include <cstdint>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {

// Elements per parallel task: big enough that thread start-up is amortised.
inline constexpr int64_t kElementwiseGrain = 32768;

// out[i] = op(in[i]); `op` takes and returns a Vectorized<opmath>.
template <typename scalar_t, typename VecOp>
void parallel_map(const VecOp& op, scalar_t* out, const scalar_t* in, int64_t n) {
  at::parallel_for(0, n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    at::vec::map(op, out + begin, in + begin, end - begin);
  });
}

// out[i] = op(a[i], b[i]).
template <typename scalar_t, typename VecOp>
void parallel_map2(const VecOp& op, scalar_t* out, const scalar_t* a,
                   const scalar_t* b, int64_t n) {
  at::parallel_for(0, n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    at::vec::map2(op, out + begin, a + begin, b + begin, end - begin);
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
