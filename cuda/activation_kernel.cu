// gelu / silu / bias_gelu CUDA kernels and their registration; checks and
// allocation are shared with the CPU and Meta backends (cpp/ops/activation.cpp).

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "activation_math.cuh"
#include "elementwise.cuh"
#include "ops/activation.h"
#include "ops_generated/cuda/activation.h"

namespace fuseops::cuda {
namespace {

template <Activation kAct>
struct ActivationOp {
  template <typename T>
  __device__ T operator()(T x) const {
    return activation_value<kAct>(x);
  }
};

template <Activation kAct>
struct ActivationBackwardOp {
  template <typename T>
  __device__ T operator()(T grad, T x) const {
    return grad * activation_derivative<kAct>(x, static_cast<T*>(nullptr));
  }
};

void activation_kernel(const at::Tensor& out, const at::Tensor& input, Activation activation) {
  c10::cuda::CUDAGuard device_guard(input.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::activation", [&] {
        dispatch_activation(activation, [&](auto act) {
          launch_elementwise(input.numel(), ActivationOp<decltype(act)::value>{},
                             out.mutable_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>());
        });
      });
}

void activation_backward_kernel(const at::Tensor& grad_input, const at::Tensor& grad_output,
                                const at::Tensor& input, Activation activation) {
  c10::cuda::CUDAGuard device_guard(input.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::activation_backward", [&] {
        dispatch_activation(activation, [&](auto act) {
          launch_elementwise(input.numel(), ActivationBackwardOp<decltype(act)::value>{},
                             grad_input.mutable_data_ptr<scalar_t>(),
                             grad_output.const_data_ptr<scalar_t>(),
                             input.const_data_ptr<scalar_t>());
        });
      });
}

// out[r, c] = gelu(x[r, c] + bias[c]); with kVec > 1, cols is a multiple of
// kVec so a vector never straddles two rows.
template <int kVec, Activation kAct, typename scalar_t>
__global__ void bias_gelu_forward_kernel(int64_t n, int64_t cols, scalar_t* __restrict__ out,
                                         const scalar_t* __restrict__ x,
                                         const scalar_t* __restrict__ bias) {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = AlignedVector<scalar_t, kVec>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kVec;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
       base < n; base += stride) {
    const int64_t col = base % cols;
    const Vec vx = *reinterpret_cast<const Vec*>(x + base);
    const Vec vb = *reinterpret_cast<const Vec*>(bias + col);
    Vec result;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const opmath_t z = static_cast<opmath_t>(vx.val[j]) + static_cast<opmath_t>(vb.val[j]);
      result.val[j] = static_cast<scalar_t>(activation_value<kAct>(z));
    }
    *reinterpret_cast<Vec*>(out + base) = result;
  }
}

void bias_gelu_kernel(const at::Tensor& out, const at::Tensor& input, const at::Tensor& bias,
                      Activation activation) {
  c10::cuda::CUDAGuard device_guard(input.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::bias_gelu", [&] {
        const int64_t n = input.numel();
        const int64_t cols = bias.numel();
        scalar_t* out_data = out.mutable_data_ptr<scalar_t>();
        const scalar_t* x = input.const_data_ptr<scalar_t>();
        const scalar_t* b = bias.const_data_ptr<scalar_t>();
        constexpr int kVec = 16 / sizeof(scalar_t);
        const bool vectorizable = can_vectorize<scalar_t>(cols, {out_data, x, b});
        auto stream = c10::cuda::getCurrentCUDAStream();
        dispatch_activation(activation, [&](auto act) {
          constexpr Activation kAct = decltype(act)::value;
          if (vectorizable) {
            bias_gelu_forward_kernel<kVec, kAct>
                <<<blocks_for(n / kVec), kThreadsPerBlock, 0, stream>>>(n, cols, out_data, x, b);
          } else {
            bias_gelu_forward_kernel<1, kAct>
                <<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(n, cols, out_data, x, b);
          }
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
      });
}

constexpr int kColumnsPerBlock = 32;
constexpr int kRowsPerBlock = 8;
constexpr int64_t kMaxRowSplits = 128;

// One pass: grad_input = grad * gelu'(x + bias) for a 32-column strip of a
// slice of rows, while each thread sums its column in opmath; the block's
// 8 row-threads are then added in shared memory and written to
// partial[blockIdx.y, col]. The row splits' partials are summed afterwards.
// No __restrict__ on grad_input, grad_output and x: bias_gelu_backward.out
// may write grad_input over either (each element is read before the same
// thread writes it).
template <Activation kAct, typename scalar_t>
__global__ void bias_gelu_backward_kernel_impl(int64_t rows, int64_t cols, scalar_t* grad_input,
                                               at::opmath_type<scalar_t>* __restrict__ partial,
                                               const scalar_t* grad_output, const scalar_t* x,
                                               const scalar_t* __restrict__ bias) {
  using opmath_t = at::opmath_type<scalar_t>;
  __shared__ opmath_t sums[kRowsPerBlock][kColumnsPerBlock + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColumnsPerBlock + threadIdx.x;
  opmath_t acc = 0;
  if (col < cols) {
    const opmath_t b = static_cast<opmath_t>(bias[col]);
    for (int64_t row = static_cast<int64_t>(blockIdx.y) * kRowsPerBlock + threadIdx.y; row < rows;
         row += static_cast<int64_t>(gridDim.y) * kRowsPerBlock) {
      const int64_t i = row * cols + col;
      const opmath_t z = static_cast<opmath_t>(x[i]) + b;
      const opmath_t g = static_cast<opmath_t>(grad_output[i]) *
                         activation_derivative<kAct>(z, static_cast<opmath_t*>(nullptr));
      grad_input[i] = static_cast<scalar_t>(g);
      acc += g;
    }
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    opmath_t total = 0;
#pragma unroll
    for (int r = 0; r < kRowsPerBlock; ++r) {
      total += sums[r][threadIdx.x];
    }
    partial[static_cast<int64_t>(blockIdx.y) * cols + col] = total;
  }
}

void bias_gelu_backward_kernel(const at::Tensor& grad_input, const at::Tensor& grad_bias,
                               const at::Tensor& grad_output, const at::Tensor& input,
                               const at::Tensor& bias, Activation activation) {
  c10::cuda::CUDAGuard device_guard(input.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::bias_gelu_backward", [&] {
        using opmath_t = at::opmath_type<scalar_t>;
        const int64_t cols = bias.numel();
        const int64_t rows = input.numel() / cols;
        const int64_t row_splits =
            std::min(kMaxRowSplits, (rows + kRowsPerBlock - 1) / kRowsPerBlock);
        at::Tensor partial = at::empty(
            {row_splits, cols}, input.options().dtype(c10::CppTypeToScalarType<opmath_t>::value));
        const dim3 block(kColumnsPerBlock, kRowsPerBlock);
        const dim3 grid(static_cast<unsigned>((cols + kColumnsPerBlock - 1) / kColumnsPerBlock),
                        static_cast<unsigned>(row_splits));
        auto stream = c10::cuda::getCurrentCUDAStream();
        dispatch_activation(activation, [&](auto act) {
          bias_gelu_backward_kernel_impl<decltype(act)::value, scalar_t>
              <<<grid, block, 0, stream>>>(
                  rows, cols, grad_input.mutable_data_ptr<scalar_t>(),
                  partial.mutable_data_ptr<opmath_t>(), grad_output.const_data_ptr<scalar_t>(),
                  input.const_data_ptr<scalar_t>(), bias.const_data_ptr<scalar_t>());
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
        grad_bias.copy_(partial.sum(0));
      });
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(ActivationCudaKernels::forward, &activation_kernel);
FUSEOPS_REGISTER_KERNEL(ActivationCudaKernels::backward, &activation_backward_kernel);
FUSEOPS_REGISTER_KERNEL(ActivationCudaKernels::bias_gelu, &bias_gelu_kernel);
FUSEOPS_REGISTER_KERNEL(ActivationCudaKernels::bias_gelu_backward, &bias_gelu_backward_kernel);

}  // namespace fuseops::cuda
