// relu CUDA kernels and their registration; checks and allocation are shared
// with the CPU and Meta backends (cpp/ops/relu.cpp).

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "elementwise.cuh"
#include "ops/relu.h"
#include "ops_generated/cuda/relu.h"

namespace fuseops::cuda {
namespace {

struct ReluOp {
  template <typename T>
  __device__ T operator()(T x) const {
    // `x != x` keeps NaN, as torch.relu does.
    return (x > T(0) || x != x) ? x : T(0);
  }
};

struct ReluBackwardOp {
  template <typename T>
  __device__ T operator()(T grad, T result) const {
    return result <= T(0) ? T(0) : grad;
  }
};

void relu_kernel(const at::Tensor& out, const at::Tensor& input) {
  c10::cuda::CUDAGuard device_guard(input.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::relu", [&] {
        launch_elementwise(input.numel(), ReluOp{}, out.mutable_data_ptr<scalar_t>(),
                           input.const_data_ptr<scalar_t>());
      });
}

void relu_backward_kernel(const at::Tensor& grad_input, const at::Tensor& grad_output,
                          const at::Tensor& result) {
  c10::cuda::CUDAGuard device_guard(result.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, result.scalar_type(), "fuseops::relu_backward", [&] {
        launch_elementwise(
            result.numel(), ReluBackwardOp{}, grad_input.mutable_data_ptr<scalar_t>(),
            grad_output.const_data_ptr<scalar_t>(), result.const_data_ptr<scalar_t>());
      });
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(ReluCudaKernels::forward, &relu_kernel);
FUSEOPS_REGISTER_KERNEL(ReluCudaKernels::backward, &relu_backward_kernel);

}  // namespace fuseops::cuda
