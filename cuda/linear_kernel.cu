// linear's CUDA kernel and its registration; checks and allocation are
// shared with the CPU and Meta backends (cpp/ops/linear.cpp). On a GPU the
// few-row product is cuBLAS's to make (its GEMV kernels read the weight at
// the device's bandwidth), so the kernel is ATen's matrix product on the
// current stream, as torch's linear.

#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "ops/linear.h"
#include "ops_generated/cuda/linear.h"

namespace fuseops::cuda {
namespace {

void linear_kernel(const at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
                   const at::Tensor& bias) {
  c10::cuda::CUDAGuard device_guard(input.device());
  at::Tensor result = out;
  if (bias.defined()) {
    at::addmm_out(result, bias, input, weight.t());
  } else {
    at::mm_out(result, input, weight.t());
  }
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(LinearCudaKernels::forward, &linear_kernel);

}  // namespace fuseops::cuda
