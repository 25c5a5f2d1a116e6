// int8 quantization CUDA kernels and their registration; checks and
// allocation are shared with the CPU and Meta backends (cpp/ops/quantize.cpp).
//
// State: simple and correct rather than tuned. quantize: one warp per row
// (absmax by warp shuffles, then divide, round to nearest even and store);
// a row holding Inf or NaN is recorded with atomicMin in one device word,
// which the host reads back after the launch (one synchronisation per call:
// the price of refusing non-finite input). dequantize: a grid-stride loop,
// one element per thread.

#include <cstdint>
#include <limits>

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <torch/library.h>

#include "elementwise.cuh"
#include "ops/quantize.h"

namespace fuseops::cuda {
namespace {

constexpr int kRowsPerBlock = kThreadsPerBlock / kWarpSize;

template <typename scalar_t>
__global__ void quantize_rows_cuda(const scalar_t* __restrict__ input, int8_t* __restrict__ q,
                                   float* __restrict__ scale, int64_t rows, int64_t k,
                                   unsigned long long* first_bad) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t row = first; row < rows; row += stride) {
    const scalar_t* x = input + row * k;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = lane; i < k; i += kWarpSize) {
      const float v = fabsf(static_cast<float>(x[i]));
      finite = finite && v <= 3.402823466e38f;  // false for Inf and NaN
      amax = fmaxf(amax, v);
    }
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    }
    if (!__all_sync(0xffffffffu, finite)) {
      if (lane == 0) {
        atomicMin(first_bad, static_cast<unsigned long long>(row));
      }
      continue;
    }
    float s = amax / 127.0f;
    if (s == 0.0f) {
      s = 1.0f;
    }
    if (lane == 0) {
      scale[row] = s;
    }
    for (int64_t i = lane; i < k; i += kWarpSize) {
      const float r = fminf(fmaxf(rintf(static_cast<float>(x[i]) / s), -127.0f), 127.0f);
      q[row * k + i] = static_cast<int8_t>(r);
    }
  }
}

int64_t quantize_rows_kernel(const at::Tensor& q, const at::Tensor& scale,
                             const at::Tensor& input) {
  c10::cuda::CUDAGuard device_guard(input.device());
  const int64_t rows = scale.numel();
  const int64_t k = input.size(-1);
  const auto none = std::numeric_limits<int64_t>::max();
  at::Tensor first_bad = at::full({1}, none, input.options().dtype(at::kLong));
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t blocks = std::min<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock, 65535);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::quantize_int8", [&] {
        quantize_rows_cuda<scalar_t><<<blocks, kThreadsPerBlock, 0, stream>>>(
            input.const_data_ptr<scalar_t>(), q.mutable_data_ptr<int8_t>(),
            scale.mutable_data_ptr<float>(), rows, k,
            reinterpret_cast<unsigned long long*>(first_bad.mutable_data_ptr<int64_t>()));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  const int64_t bad = first_bad.item<int64_t>();
  return bad == none ? -1 : bad;
}

template <typename scalar_t>
__global__ void dequantize_cuda(scalar_t* __restrict__ out, const int8_t* __restrict__ q,
                                const float* __restrict__ scale, int64_t n, int64_t size,
                                int64_t inner) {
  using opmath_t = at::opmath_type<scalar_t>;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = i / (size * inner);
    const int64_t c = i % inner;
    out[i] = static_cast<scalar_t>(static_cast<opmath_t>(q[i]) *
                                   static_cast<opmath_t>(scale[o * inner + c]));
  }
}

void dequantize_kernel(const at::Tensor& out, const at::Tensor& q, const at::Tensor& scale,
                       int64_t outer, int64_t size, int64_t inner) {
  c10::cuda::CUDAGuard device_guard(q.device());
  const int64_t n = q.numel();
  const int64_t blocks = std::min<int64_t>((n + kThreadsPerBlock - 1) / kThreadsPerBlock, 65535);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, out.scalar_type(), "fuseops::dequantize_int8", [&] {
        dequantize_cuda<scalar_t><<<blocks, kThreadsPerBlock, 0, stream>>>(
            out.mutable_data_ptr<scalar_t>(), q.const_data_ptr<int8_t>(),
            scale.const_data_ptr<float>(), n, size, inner);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

struct Kernels {
  static detail::QuantizeRowsKernel quantize() { return &quantize_rows_kernel; }
  static detail::DequantizeKernel dequantize() { return &dequantize_kernel; }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CUDA, m) {
  detail::QuantizeRegistrations<Kernels>::register_all(m);
}

}  // namespace fuseops::cuda
