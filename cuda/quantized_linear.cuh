#pragma once
// What the int8, int4 and 2:4 linear CUDA kernels share: one thread per
// output element (row m, channel ch) of out [m_total, n], in a grid-stride
// loop, and the CPU kernels' epilogue, so both devices give the same bits.

#include <cstdint>

#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "elementwise.cuh"

namespace fuseops::cuda {

// The sizes every kernel gets: input [m_total, k], n output channels.
struct LinearShape {
  int64_t m_total;
  int64_t n;
  int64_t k;
};

// out[m, ch] for every output element: dot(m, ch) (the float32, float64 or
// int32 sum over K), times x_scale[m] when given (W8A8), times scale[ch]
// when given, plus bias[ch] when given, each step in scalar_t's opmath type
// and in that order.
template <typename scalar_t, typename Dot>
__device__ void store_linear_outputs(scalar_t* __restrict__ out, LinearShape shape,
                                     const float* __restrict__ x_scale,
                                     const float* __restrict__ scale,
                                     const scalar_t* __restrict__ bias, const Dot& dot) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t total = shape.m_total * shape.n;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / shape.n;
    const int64_t ch = i % shape.n;
    opmath_t value = static_cast<opmath_t>(dot(m, ch));
    if (x_scale != nullptr) {
      value = value * static_cast<opmath_t>(x_scale[m]);
    }
    if (scale != nullptr) {
      value = value * static_cast<opmath_t>(scale[ch]);
    }
    if (bias != nullptr) {
      value += static_cast<opmath_t>(bias[ch]);
    }
    out[i] = static_cast<scalar_t>(value);
  }
}

// Launches `kernel` (which calls store_linear_outputs) with a thread per
// output element of `shape`, on the current stream, and checks the launch.
template <typename... Params, typename... Args>
void launch_linear_kernel(void (*kernel)(Params...), const LinearShape& shape,
                          const Args&... args) {
  kernel<<<blocks_for(shape.m_total * shape.n), kThreadsPerBlock, 0,
           c10::cuda::getCurrentCUDAStream()>>>(args...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace fuseops::cuda
