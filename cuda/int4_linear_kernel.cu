// int4 linear CUDA kernel and its registration; checks and allocation are
// shared with the CPU and Meta backends (cpp/ops/int4_linear.cpp).
//
// State: a simple, correct kernel, not a tuned one (no shared-memory
// tiling, no tensor cores). One thread per output element (row m, channel
// n): it walks the channel's groups, reading one byte per pair of K
// positions (threads of a warp take consecutive channels of a block, so
// their bytes are adjacent), and sums exactly as the CPU kernels do (two
// fused multiply-add chains of x * q per group, even and odd positions; the
// zero point's share, zero * the group's sum of activations, taken off
// their sum by one more, and the group's scale applied by another), so both
// devices give the same bits.
//
// W4A8 (int4_dynamic_linear), as simple: one warp per group of a row
// quantizes it (quantize_row.cuh, the CPU kernels' math: a scale per row and
// weight group), then one thread per output sums q * xq per group in int32
// (exact, as on the CPU) and applies the zero point and the product of the
// group's and the activations' scales with the CPU kernels' float32
// operations in their order.

#include <cstdint>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <torch/library.h>

#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include "elementwise.cuh"
#include "ops/int4_linear.h"
#include "ops_generated/cuda/int4_linear.h"
#include "quantize_row.cuh"
#include "quantized_linear.cuh"

namespace fuseops::cuda {
namespace {

// Calls fn with a value of scale_zero's element type (float32 or bfloat16,
// which the shared checks allow); the kernels read either as the float32
// it widens to (exact), so both give the same bits.
template <typename Fn>
void with_scale_type(const at::Tensor& scale_zero, const Fn& fn) {
  if (scale_zero.scalar_type() == at::kBFloat16) {
    fn(c10::BFloat16());
  } else {
    fn(float());
  }
}

template <typename scalar_t, typename scale_t>
__global__ void int4_weight_only_linear_cuda(scalar_t* __restrict__ out,
                                             const scalar_t* __restrict__ x,
                                             const uint8_t* __restrict__ packed,
                                             const scale_t* __restrict__ scale_zero,
                                             const scalar_t* __restrict__ bias, LinearShape shape,
                                             int64_t groups, int64_t group_size) {
  const int64_t n = shape.n;
  const int64_t k = shape.k;
  const int64_t pairs = group_size / 2;
  store_linear_outputs(out, shape, nullptr, nullptr, bias, [&](int64_t m, int64_t ch) {
    const int64_t block = ch / detail::kInt4BlockN;
    const uint8_t* w =
        packed + block * groups * pairs * detail::kInt4BlockN + ch % detail::kInt4BlockN;
    const scalar_t* row = x + m * k;
    float result = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      const float scale = static_cast<float>(scale_zero[(2 * g) * n + ch]);
      const float zero = static_cast<float>(scale_zero[(2 * g + 1) * n + ch]);
      float even = 0.0f;
      float odd = 0.0f;
      float x_sum = 0.0f;
      for (int64_t p = 0; p < pairs; ++p) {
        const uint8_t byte = w[(g * pairs + p) * detail::kInt4BlockN];
        const int64_t k0 = g * group_size + 2 * p;
        // Past K the activations are 0, as in the CPU kernels' padded rows.
        const float x0 = k0 < k ? static_cast<float>(row[k0]) : 0.0f;
        const float x1 = k0 + 1 < k ? static_cast<float>(row[k0 + 1]) : 0.0f;
        even = fmaf(static_cast<float>(byte & 0xF), x0, even);
        odd = fmaf(static_cast<float>(byte >> 4), x1, odd);
        // In position order, as the CPU kernels' sums.
        x_sum = __fadd_rn(__fadd_rn(x_sum, x0), x1);
      }
      result = fmaf(scale, fmaf(-zero, x_sum, even + odd), result);
    }
    return result;
  });
}

void int4_weight_only_linear_kernel(const at::Tensor& out, const at::Tensor& input,
                                    const at::Tensor& packed, const at::Tensor& scale_zero,
                                    int64_t group_size, const at::Tensor& bias) {
  c10::cuda::CUDAGuard device_guard(input.device());
  const LinearShape shape{input.size(0), scale_zero.size(2), input.size(1)};
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::int4_weight_only_linear", [&] {
        with_scale_type(scale_zero, [&](auto scale_type) {
          using scale_t = decltype(scale_type);
          launch_linear_kernel(&int4_weight_only_linear_cuda<scalar_t, scale_t>, shape,
                               out.mutable_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(),
                               packed.const_data_ptr<uint8_t>(),
                               scale_zero.const_data_ptr<scale_t>(),
                               bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr, shape,
                               scale_zero.size(0), group_size);
        });
      });
}

// x_scale[m * groups + g]: the scale of row m's group g.
template <typename scalar_t, typename scale_t>
__global__ void int4_dynamic_linear_cuda(scalar_t* __restrict__ out, const int8_t* __restrict__ xq,
                                         const float* __restrict__ x_scale,
                                         const uint8_t* __restrict__ packed,
                                         const scale_t* __restrict__ scale_zero,
                                         const scalar_t* __restrict__ bias, LinearShape shape,
                                         int64_t x_stride, int64_t groups, int64_t group_size) {
  const int64_t n = shape.n;
  const int64_t pairs = group_size / 2;
  store_linear_outputs(out, shape, nullptr, nullptr, bias, [&](int64_t m, int64_t ch) {
    const int64_t block = ch / detail::kInt4BlockN;
    const uint8_t* w =
        packed + block * groups * pairs * detail::kInt4BlockN + ch % detail::kInt4BlockN;
    const int8_t* row = xq + m * x_stride;
    float result = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      const float scale = static_cast<float>(scale_zero[(2 * g) * n + ch]);
      const float zero = static_cast<float>(scale_zero[(2 * g + 1) * n + ch]);
      int dot = 0;
      int x_sum = 0;
      for (int64_t p = 0; p < pairs; ++p) {
        const uint8_t byte = w[(g * pairs + p) * detail::kInt4BlockN];
        const int64_t k0 = g * group_size + 2 * p;
        // Past K the activations are 0 (the buffer's zeros).
        const int x0 = row[k0];
        const int x1 = row[k0 + 1];
        dot += (byte & 0xF) * x0 + (byte >> 4) * x1;
        x_sum += x0 + x1;
      }
      result = fmaf(scale * x_scale[m * groups + g],
                    fmaf(-zero, static_cast<float>(x_sum), static_cast<float>(dot)), result);
    }
    return result;
  });
}

void int4_dynamic_linear_kernel(const at::Tensor& out, const at::Tensor& input,
                                const at::Tensor& packed, const at::Tensor& scale_zero,
                                int64_t group_size, const at::Tensor& bias) {
  c10::cuda::CUDAGuard device_guard(input.device());
  const LinearShape shape{input.size(0), scale_zero.size(2), input.size(1)};
  const int64_t groups = scale_zero.size(0);
  const int64_t x_stride = groups * group_size;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::int4_dynamic_linear", [&] {
        // Whole groups, zeros past K, each group of a row quantized as a
        // row of its own.
        const at::Tensor padded =
            x_stride == shape.k ? input : at::constant_pad_nd(input, {0, x_stride - shape.k}, 0);
        const QuantizedRows x =
            quantize_activation_rows<scalar_t>(padded.reshape({shape.m_total * groups, group_size}),
                                               group_size, c10::cuda::getCurrentCUDAStream());
        with_scale_type(scale_zero, [&](auto scale_type) {
          using scale_t = decltype(scale_type);
          launch_linear_kernel(&int4_dynamic_linear_cuda<scalar_t, scale_t>, shape,
                               out.mutable_data_ptr<scalar_t>(), x.values.const_data_ptr<int8_t>(),
                               x.scales.const_data_ptr<float>(), packed.const_data_ptr<uint8_t>(),
                               scale_zero.const_data_ptr<scale_t>(),
                               bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr, shape,
                               x_stride, groups, group_size);
        });
      });
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(Int4LinearCudaKernels::weight_only, &int4_weight_only_linear_kernel);
FUSEOPS_REGISTER_KERNEL(Int4LinearCudaKernels::dynamic, &int4_dynamic_linear_kernel);

}  // namespace fuseops::cuda
