// relu CUDA kernels and their registration; checks and allocation are shared
// with the CPU and Meta backends (cpp/ops/relu.cpp).

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "elementwise.cuh"
#include "ops/relu.h"

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
        launch_elementwise(result.numel(), ReluBackwardOp{},
                           grad_input.mutable_data_ptr<scalar_t>(),
                           grad_output.const_data_ptr<scalar_t>(),
                           result.const_data_ptr<scalar_t>());
      });
}

at::Tensor relu_cuda(const at::Tensor& input) {
  return detail::relu_with(input, &relu_kernel);
}
void relu_out_cuda(const at::Tensor& input, at::Tensor& out) {
  detail::relu_out_with(input, out, &relu_kernel);
}
at::Tensor relu_backward_cuda(const at::Tensor& grad_output, const at::Tensor& result) {
  return detail::relu_backward_with(grad_output, result, &relu_backward_kernel);
}

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, CUDA, m) {
  m.impl("relu", TORCH_FN(relu_cuda));
  m.impl("relu.out", TORCH_FN(relu_out_cuda));
  m.impl("relu_backward", TORCH_FN(relu_backward_cuda));
}

}  // namespace fuseops::cuda
