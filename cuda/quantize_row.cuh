#pragma once
// Symmetric int8 quantization of rows, the math of quantize_per_token_int8:
// scale = absmax / 127 (1 for a row whose absmax / 127 is 0), q = round(x /
// scale), ties to even. Shared by the quantize kernels and
// int8_dynamic_linear's activations.
//
// One warp per row: absmax by warp shuffles, then divide, round and store.

#include <algorithm>
#include <cstdint>
#include <limits>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include "elementwise.cuh"

namespace fuseops::cuda {

// What a row holding Inf or NaN gets.
enum class NonFiniteRow {
  // Nothing written; the lowest such row index goes to *first_bad (atomicMin)
  // so that the host can refuse the input.
  kRefuse,
  // q = 0 and scale = NaN, so that whatever the row feeds comes out NaN.
  kNanScale,
};

inline constexpr int kQuantizeRowsPerBlock = kThreadsPerBlock / kWarpSize;

// Row r of `input` (k values) into q + r * q_stride and scale[r].
template <NonFiniteRow kPolicy, typename scalar_t>
__global__ void quantize_rows_int8_cuda(const scalar_t* __restrict__ input, int64_t rows, int64_t k,
                                        int8_t* __restrict__ q, int64_t q_stride,
                                        float* __restrict__ scale, unsigned long long* first_bad) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t first =
      static_cast<int64_t>(blockIdx.x) * kQuantizeRowsPerBlock + threadIdx.x / kWarpSize;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kQuantizeRowsPerBlock;
  for (int64_t row = first; row < rows; row += stride) {
    const scalar_t* x = input + row * k;
    int8_t* qr = q + row * q_stride;
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
      if constexpr (kPolicy == NonFiniteRow::kRefuse) {
        if (lane == 0) {
          atomicMin(first_bad, static_cast<unsigned long long>(row));
        }
      } else {
        if (lane == 0) {
          scale[row] = std::numeric_limits<float>::quiet_NaN();
        }
        for (int64_t i = lane; i < k; i += kWarpSize) {
          qr[i] = 0;
        }
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
      // Division and round half to even, as the CPU kernels.
      const float v = fminf(fmaxf(rintf(static_cast<float>(x[i]) / s), -127.0f), 127.0f);
      qr[i] = static_cast<int8_t>(v);
    }
  }
}

// Launches quantize_rows_int8_cuda over `rows` (> 0) rows on `stream`;
// first_bad is used with kRefuse only.
template <NonFiniteRow kPolicy, typename scalar_t>
void quantize_rows_int8(const scalar_t* input, int64_t rows, int64_t k, int8_t* q, int64_t q_stride,
                        float* scale, unsigned long long* first_bad, cudaStream_t stream) {
  const int64_t blocks =
      std::min<int64_t>((rows + kQuantizeRowsPerBlock - 1) / kQuantizeRowsPerBlock, 65535);
  quantize_rows_int8_cuda<kPolicy, scalar_t>
      <<<blocks, kThreadsPerBlock, 0, stream>>>(input, rows, k, q, q_stride, scale, first_bad);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The int8 rows and float32 scales of a W8A8 linear's activations `input`
// [rows > 0, k], quantized per row as the CPU kernels do (a row with a
// non-finite value gets a NaN scale); `stride` >= k is the int8 row length,
// zero past k, for kernels that read whole groups.
struct QuantizedRows {
  at::Tensor values;  // int8 [rows, stride]
  at::Tensor scales;  // float32 [rows]
};

template <typename scalar_t>
QuantizedRows quantize_activation_rows(const at::Tensor& input, int64_t stride,
                                       cudaStream_t stream) {
  const int64_t rows = input.size(0);
  const int64_t k = input.size(1);
  const auto int8 = input.options().dtype(at::kChar);
  QuantizedRows q{stride == k ? at::empty({rows, stride}, int8) : at::zeros({rows, stride}, int8),
                  at::empty({rows}, input.options().dtype(at::kFloat))};
  quantize_rows_int8<NonFiniteRow::kNanScale>(input.const_data_ptr<scalar_t>(), rows, k,
                                              q.values.mutable_data_ptr<int8_t>(), stride,
                                              q.scales.mutable_data_ptr<float>(), nullptr, stream);
  return q;
}

}  // namespace fuseops::cuda
