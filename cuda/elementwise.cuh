#pragma once
// Elementwise maps over contiguous device buffers: 16-byte vector loads and
// stores when every pointer is aligned, a grid-stride loop, float32 math for
// bfloat16/float16 (at::opmath_type), int64 indexing; and what the row
// kernels share: warp_sum, and merge_max_sum of an online softmax.

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

namespace fuseops::cuda {

template <typename T, int N>
struct alignas(sizeof(T) * N) AlignedVector {
  T val[N];
};

inline bool is_aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// Every kernel's vector loads and stores are this wide.
inline constexpr int kVectorBytes = 16;

// Whether every pointer is kVectorBytes-aligned; null pointers (absent
// optional tensors) do not count.
inline bool all_aligned(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (p != nullptr && !is_aligned(p, kVectorBytes)) {
      return false;
    }
  }
  return true;
}

// Whether vectors of T may run along rows that start `row_elements` apart in
// each of `pointers`: no vector straddles two rows and every row starts
// aligned.
template <typename T>
bool can_vectorize(int64_t row_elements, std::initializer_list<const void*> pointers) {
  constexpr int64_t kVec = kVectorBytes / sizeof(T);
  return row_elements % kVec == 0 && all_aligned(pointers);
}

constexpr int kWarpSize = 32;

// Sum of `value` over the warp, returned to every lane.
template <typename T>
__device__ __forceinline__ T warp_sum(T value) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// Merges (m, s) with (m2, s2): the running maxima and sums of exp(z - m)
// of an online softmax (cross_entropy, jsd). A NaN maximum propagates.
template <typename acc_t>
__device__ __forceinline__ void merge_max_sum(acc_t& m, acc_t& s, acc_t m2, acc_t s2) {
  const acc_t m_new = m2 > m || m2 != m2 ? m2 : m;
  s = s * ::exp(m - m_new) + s2 * ::exp(m2 - m_new);
  m = m_new;
}

constexpr int kThreadsPerBlock = 256;

inline int64_t blocks_for(int64_t work_items) {
  // Enough blocks to fill the device several times over; the grid-stride
  // loop covers the rest.
  constexpr int64_t kMaxBlocks = 65535;
  const int64_t blocks = (work_items + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

// out[i] = op(a[i]) or op(a[i], b[i]), kVec elements per thread per step.
// `b` is nullptr for unary ops. No __restrict__: `out` may be exactly `a` or
// `b` (out= in place, and backward kernels writing over the incoming
// gradient); each element is read before the same thread writes it.
template <int kVec, bool kBinary, typename scalar_t, typename Op>
__global__ void elementwise_kernel(int64_t n, Op op, scalar_t* out, const scalar_t* a,
                                   const scalar_t* b) {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = AlignedVector<scalar_t, kVec>;
  auto apply = [&](scalar_t x, scalar_t y) {
    if constexpr (kBinary) {
      return static_cast<scalar_t>(op(static_cast<opmath_t>(x), static_cast<opmath_t>(y)));
    } else {
      return static_cast<scalar_t>(op(static_cast<opmath_t>(x)));
    }
  };
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kVec;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
       base < n; base += stride) {
    if (base + kVec <= n) {
      const Vec va = *reinterpret_cast<const Vec*>(a + base);
      Vec vb;
      if constexpr (kBinary) {
        vb = *reinterpret_cast<const Vec*>(b + base);
      }
      Vec result;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        result.val[j] = apply(va.val[j], kBinary ? vb.val[j] : scalar_t(0));
      }
      *reinterpret_cast<Vec*>(out + base) = result;
    } else {
      for (int64_t i = base; i < n; ++i) {
        out[i] = apply(a[i], kBinary ? b[i] : scalar_t(0));
      }
    }
  }
}

template <bool kBinary, typename scalar_t, typename Op>
void launch_elementwise_impl(int64_t n, Op op, scalar_t* out, const scalar_t* a,
                             const scalar_t* b) {
  if (n == 0) {
    return;
  }
  constexpr int kVec = 16 / sizeof(scalar_t);
  auto stream = c10::cuda::getCurrentCUDAStream();
  const bool vectorizable = all_aligned({out, a, b});
  if (vectorizable) {
    elementwise_kernel<kVec, kBinary>
        <<<blocks_for((n + kVec - 1) / kVec), kThreadsPerBlock, 0, stream>>>(n, op, out, a, b);
  } else {
    elementwise_kernel<1, kBinary>
        <<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(n, op, out, a, b);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Launches `op` over n elements on the current stream of the current device.
template <typename scalar_t, typename Op>
void launch_elementwise(int64_t n, Op op, scalar_t* out, const scalar_t* a) {
  launch_elementwise_impl<false>(n, op, out, a, static_cast<const scalar_t*>(nullptr));
}

template <typename scalar_t, typename Op>
void launch_elementwise(int64_t n, Op op, scalar_t* out, const scalar_t* a, const scalar_t* b) {
  launch_elementwise_impl<true>(n, op, out, a, b);
}

}  // namespace fuseops::cuda
