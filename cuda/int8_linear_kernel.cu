// int8 linear CUDA kernels and their registration; checks and allocation
// are shared with the CPU and Meta backends (cpp/ops/int8_linear.cpp).
//
// State: a simple, correct kernel, not a tuned one (no tensor cores, no
// shared-memory tiling). One thread per output element (row m, channel n):
// it walks K in groups of 4, reading the channel's 4 int8 weights as one
// 32-bit word of the packed layout (threads of a warp take consecutive
// channels of a block, so their words are adjacent) and the row's 4
// activations, accumulating in float32; the scale and bias are applied
// once at the end.
//
// W8A8 dynamic (int8_dynamic_linear), as simple: one warp per activation
// block of 32 of a row quantizes it (quantize_row.cuh: a scale per block,
// the CPU kernels' math) into an int8 buffer of whole blocks (zeros past
// K), then one thread per output element sums each block's groups of 4
// with __dp4a (signed x signed, exact in int32, no column-sum correction
// needed), folds the block's sum into a float32 accumulator with the
// block's scale (fmaf, block after block, as the CPU kernels do) and
// applies the channel's scale and the bias, so both devices give the same
// bits.

#include <cstdint>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <torch/library.h>

#include "elementwise.cuh"
#include "ops/int8_linear.h"
#include "ops_generated/cuda/int8_linear.h"
#include "quantize_row.cuh"
#include "quantized_linear.cuh"

namespace fuseops::cuda {
namespace {

template <typename scalar_t>
__global__ void weight_only_linear_cuda(scalar_t* __restrict__ out, const scalar_t* __restrict__ x,
                                        const int8_t* __restrict__ packed,
                                        const float* __restrict__ scale,
                                        const scalar_t* __restrict__ bias, LinearShape shape,
                                        int64_t groups) {
  const int64_t k = shape.k;
  store_linear_outputs(out, shape, nullptr, scale, bias, [&](int64_t m, int64_t ch) {
    const int64_t block = ch / detail::kInt8BlockN;
    const int64_t c = ch % detail::kInt8BlockN;
    const int8_t* w = packed + (block * groups * detail::kInt8BlockN + c) * detail::kInt8GroupK;
    const scalar_t* row = x + m * k;
    float acc = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      const char4 q =
          *reinterpret_cast<const char4*>(w + g * detail::kInt8BlockN * detail::kInt8GroupK);
      const int64_t k0 = g * detail::kInt8GroupK;
      // Past K the packed weights are 0, but the activations are not there.
      acc += static_cast<float>(q.x) * static_cast<float>(row[k0]);
      if (k0 + 1 < k) acc += static_cast<float>(q.y) * static_cast<float>(row[k0 + 1]);
      if (k0 + 2 < k) acc += static_cast<float>(q.z) * static_cast<float>(row[k0 + 2]);
      if (k0 + 3 < k) acc += static_cast<float>(q.w) * static_cast<float>(row[k0 + 3]);
    }
    return acc;
  });
}

void weight_only_linear_kernel(const at::Tensor& out, const at::Tensor& input,
                               const at::Tensor& packed, const at::Tensor& scale,
                               const at::Tensor& bias) {
  c10::cuda::CUDAGuard device_guard(input.device());
  const LinearShape shape{input.size(0), scale.size(0), input.size(1)};
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::int8_weight_only_linear", [&] {
        launch_linear_kernel(&weight_only_linear_cuda<scalar_t>, shape,
                             out.mutable_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(),
                             packed.const_data_ptr<int8_t>(), scale.const_data_ptr<float>(),
                             bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr, shape,
                             packed.size(1));
      });
}

// x_scale[m * activation_blocks + b]: the scale of row m's block b; xq
// rows of activation_blocks * 32 values.
template <typename scalar_t>
__global__ void dynamic_linear_cuda(scalar_t* __restrict__ out, const int8_t* __restrict__ xq,
                                    const float* __restrict__ x_scale,
                                    const int8_t* __restrict__ packed,
                                    const float* __restrict__ scale,
                                    const scalar_t* __restrict__ bias, LinearShape shape,
                                    int64_t groups, int64_t activation_blocks) {
  constexpr int64_t kBlockGroups = detail::kInt8ActivationBlockK / detail::kInt8GroupK;
  store_linear_outputs(out, shape, nullptr, scale, bias, [&](int64_t m, int64_t ch) {
    const int64_t block = ch / detail::kInt8BlockN;
    const int64_t c = ch % detail::kInt8BlockN;
    const int* w = reinterpret_cast<const int*>(packed) + block * groups * detail::kInt8BlockN + c;
    const int* x =
        reinterpret_cast<const int*>(xq + m * activation_blocks * detail::kInt8ActivationBlockK);
    float result = 0.0f;
    for (int64_t b = 0; b < activation_blocks; ++b) {
      const int64_t block_end = (b + 1) * kBlockGroups;
      const int64_t end = block_end < groups ? block_end : groups;
      int acc = 0;
      for (int64_t g = b * kBlockGroups; g < end; ++g) {
        acc = __dp4a(x[g], w[g * detail::kInt8BlockN], acc);
      }
      result = fmaf(x_scale[m * activation_blocks + b], static_cast<float>(acc), result);
    }
    return result;
  });
}

void dynamic_linear_kernel(const at::Tensor& out, const at::Tensor& input, const at::Tensor& packed,
                           const at::Tensor& scale,
                           const at::Tensor& /*colsum: signed products need none*/,
                           const at::Tensor& bias) {
  c10::cuda::CUDAGuard device_guard(input.device());
  const LinearShape shape{input.size(0), scale.size(0), input.size(1)};
  const int64_t groups = packed.size(1);
  constexpr int64_t kBlockK = detail::kInt8ActivationBlockK;
  const int64_t activation_blocks = (shape.k + kBlockK - 1) / kBlockK;
  const int64_t padded_k = activation_blocks * kBlockK;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::int8_dynamic_linear", [&] {
        // Whole blocks, zeros past K, each block of a row quantized as a
        // row of its own.
        const at::Tensor padded =
            padded_k == shape.k ? input : at::constant_pad_nd(input, {0, padded_k - shape.k}, 0);
        const QuantizedRows x = quantize_activation_rows<scalar_t>(
            padded.reshape({shape.m_total * activation_blocks, kBlockK}), kBlockK,
            c10::cuda::getCurrentCUDAStream());
        launch_linear_kernel(&dynamic_linear_cuda<scalar_t>, shape,
                             out.mutable_data_ptr<scalar_t>(), x.values.const_data_ptr<int8_t>(),
                             x.scales.const_data_ptr<float>(), packed.const_data_ptr<int8_t>(),
                             scale.const_data_ptr<float>(),
                             bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr, shape,
                             groups, activation_blocks);
      });
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(Int8LinearCudaKernels::weight_only, &weight_only_linear_kernel);
FUSEOPS_REGISTER_KERNEL(Int8LinearCudaKernels::dynamic, &dynamic_linear_kernel);

}  // namespace fuseops::cuda
