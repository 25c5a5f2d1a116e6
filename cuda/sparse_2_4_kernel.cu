// 2:4 sparse linear CUDA kernel and its registration; checks and
// allocation are shared with the CPU and Meta backends
// (cpp/ops/sparse_2_4.cpp). prune_2_4 and pack_2_4 are ATen ops and run on
// CUDA as they are.
//
// State: a simple, correct kernel, not a tuned one (no sparse tensor cores,
// no shared-memory tiling). One thread per output element (row m, channel
// n): it walks the channel's mask a byte (8 input features) at a time and
// multiplies each kept value by its activation, summing in float32
// (float64 for float64 activations); the scale and bias are
// applied once at the end, as on the CPU.
//
// W8A8 dynamic (sparse_2_4_dynamic_linear), as simple: one warp per row
// quantizes it (quantize_row.cuh, the CPU kernels' math), then one
// thread per output element walks the channel's mask the same way and sums
// the int8 products in int32 (signed x signed, exact: no column-sum
// correction needed), with the CPU kernels' epilogue, so both devices give
// the same bits.

#include <cstdint>
#include <type_traits>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <torch/library.h>

#include "elementwise.cuh"
#include "ops/sparse_2_4.h"
#include "ops_generated/cuda/sparse_2_4.h"
#include "quantize_row.cuh"
#include "quantized_linear.cuh"

namespace fuseops::cuda {
namespace {

// The sum, in acc_t, of row[col] * the kept values in K order, over the
// positions col the channel's mask bits keep.
template <typename acc_t, typename x_t, typename value_t>
__device__ acc_t kept_dot(const x_t* row, const value_t* v, const uint8_t* mb, int64_t k,
                          int64_t v_stride, int64_t meta_stride) {
  acc_t acc = 0;
  int64_t next = 0;
  for (int64_t byte = 0; byte < meta_stride; ++byte) {
    const unsigned bits = mb[byte];
    for (int j = 0; j < 8; ++j) {
      const int64_t col = 8 * byte + j;
      if (((bits >> j) & 1u) && col < k && next < v_stride) {
        acc += static_cast<acc_t>(row[col]) * static_cast<acc_t>(v[next++]);
      }
    }
  }
  return acc;
}

template <typename scalar_t, typename value_t>
__global__ void sparse_linear_cuda(scalar_t* __restrict__ out, const scalar_t* __restrict__ x,
                                   const value_t* __restrict__ values,
                                   const uint8_t* __restrict__ meta,
                                   const float* __restrict__ scale,
                                   const scalar_t* __restrict__ bias, LinearShape shape) {
  // float64 sums for float64 activations, as on the CPU.
  using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
  const int64_t k = shape.k;
  const int64_t v_stride = k / 2;
  const int64_t meta_stride = (k + 7) / 8;
  store_linear_outputs(out, shape, nullptr, scale, bias, [&](int64_t m, int64_t ch) {
    return kept_dot<acc_t>(x + m * k, values + ch * v_stride, meta + ch * meta_stride, k, v_stride,
                           meta_stride);
  });
}

void sparse_linear_kernel(const at::Tensor& out, const at::Tensor& input, const at::Tensor& values,
                          const at::Tensor& meta, const at::Tensor& scale, const at::Tensor& bias) {
  c10::cuda::CUDAGuard device_guard(input.device());
  const LinearShape shape{input.size(0), values.size(0), input.size(1)};
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::sparse_2_4_linear", [&] {
        const auto launch = [&](auto value_type) {
          using value_t = decltype(value_type);
          launch_linear_kernel(&sparse_linear_cuda<scalar_t, value_t>, shape,
                               out.mutable_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(),
                               values.const_data_ptr<value_t>(), meta.const_data_ptr<uint8_t>(),
                               scale.const_data_ptr<float>(),
                               bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr, shape);
        };
        if (values.scalar_type() == at::kChar) {
          launch(int8_t());
        } else {
          launch(scalar_t());
        }
      });
}

template <typename scalar_t>
__global__ void sparse_dynamic_linear_cuda(
    scalar_t* __restrict__ out, const int8_t* __restrict__ xq, const float* __restrict__ x_scale,
    const int8_t* __restrict__ values, const uint8_t* __restrict__ meta,
    const float* __restrict__ scale, const scalar_t* __restrict__ bias, LinearShape shape) {
  const int64_t k = shape.k;
  const int64_t v_stride = k / 2;
  const int64_t meta_stride = (k + 7) / 8;
  store_linear_outputs(out, shape, x_scale, scale, bias, [&](int64_t m, int64_t ch) {
    return kept_dot<int>(xq + m * k, values + ch * v_stride, meta + ch * meta_stride, k, v_stride,
                         meta_stride);
  });
}

void sparse_dynamic_linear_kernel(const at::Tensor& out, const at::Tensor& input,
                                  const at::Tensor& values, const at::Tensor& meta,
                                  const at::Tensor& scale,
                                  const at::Tensor& /*colsum: signed products need none*/,
                                  const at::Tensor& bias) {
  c10::cuda::CUDAGuard device_guard(input.device());
  const LinearShape shape{input.size(0), values.size(0), input.size(1)};
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::sparse_2_4_dynamic_linear", [&] {
        const QuantizedRows x =
            quantize_activation_rows<scalar_t>(input, shape.k, c10::cuda::getCurrentCUDAStream());
        launch_linear_kernel(&sparse_dynamic_linear_cuda<scalar_t>, shape,
                             out.mutable_data_ptr<scalar_t>(), x.values.const_data_ptr<int8_t>(),
                             x.scales.const_data_ptr<float>(), values.const_data_ptr<int8_t>(),
                             meta.const_data_ptr<uint8_t>(), scale.const_data_ptr<float>(),
                             bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr, shape);
      });
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(Sparse24CudaKernels::linear, &sparse_linear_kernel);
FUSEOPS_REGISTER_KERNEL(Sparse24CudaKernels::dynamic, &sparse_dynamic_linear_kernel);

}  // namespace fuseops::cuda
