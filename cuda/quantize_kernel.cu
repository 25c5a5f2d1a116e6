// int8 quantization CUDA kernels and their registration; checks and
// allocation are shared with the CPU and Meta backends (cpp/ops/quantize.cpp).
//
// State: simple and correct rather than tuned. quantize: one warp per row
// (quantize_row.cuh); a row holding Inf or NaN is recorded with atomicMin
// in one device word, which the host reads back after the launch (one
// synchronisation per call: the price of refusing non-finite input).
// dequantize: a grid-stride loop, one element per thread.

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
#include "ops_generated/cuda/quantize.h"
#include "quantize_row.cuh"

namespace fuseops::cuda {
namespace {

int64_t quantize_rows_kernel(const at::Tensor& q, const at::Tensor& scale,
                             const at::Tensor& input) {
  c10::cuda::CUDAGuard device_guard(input.device());
  const int64_t rows = scale.numel();
  const int64_t k = input.size(-1);
  const auto none = std::numeric_limits<int64_t>::max();
  at::Tensor first_bad = at::full({1}, none, input.options().dtype(at::kLong));
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::quantize_int8", [&] {
        quantize_rows_int8<NonFiniteRow::kRefuse>(
            input.const_data_ptr<scalar_t>(), rows, k, q.mutable_data_ptr<int8_t>(), k,
            scale.mutable_data_ptr<float>(),
            reinterpret_cast<unsigned long long*>(first_bad.mutable_data_ptr<int64_t>()), stream);
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
  const int64_t blocks = blocks_for(n);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, out.scalar_type(), "fuseops::dequantize_int8", [&] {
        dequantize_cuda<scalar_t><<<blocks, kThreadsPerBlock, 0, stream>>>(
            out.mutable_data_ptr<scalar_t>(), q.const_data_ptr<int8_t>(),
            scale.const_data_ptr<float>(), n, size, inner);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(QuantizeCudaKernels::quantize, &quantize_rows_kernel);
FUSEOPS_REGISTER_KERNEL(QuantizeCudaKernels::dequantize, &dequantize_kernel);

}  // namespace fuseops::cuda
