// relu CPU kernels; compiled once per CPU capability (FuseopsCpuKernels.cmake).

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>

#include "ops/cpu/elementwise.h"
#include "ops_generated/cpu/relu.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

void relu_kernel_impl(const at::Tensor& out, const at::Tensor& input) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::relu", [&] {
        parallel_map(
            [](auto x) {
              // Float vectors (elementwise.h widens bfloat16/float16):
              // at::vec::maximum of float propagates NaN, like torch.relu.
              return at::vec::maximum(x, decltype(x)(0));
            },
            out.mutable_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(), input.numel());
      });
}

void relu_backward_kernel_impl(const at::Tensor& grad_input, const at::Tensor& grad_output,
                               const at::Tensor& result) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, result.scalar_type(), "fuseops::relu_backward", [&] {
        parallel_map2(
            [](auto grad, auto res) {
              using Vec = decltype(grad);
              // result <= 0 is false for NaN, so NaN passes the gradient on
              // (ATen's threshold_backward does the same).
              return Vec::blendv(grad, Vec(0), res <= Vec(0));
            },
            grad_input.mutable_data_ptr<scalar_t>(), grad_output.const_data_ptr<scalar_t>(),
            result.const_data_ptr<scalar_t>(), result.numel());
      });
}

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(ReluCpuKernels::forward, &relu_kernel_impl);
FUSEOPS_REGISTER_CPU_KERNEL(ReluCpuKernels::backward, &relu_backward_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
