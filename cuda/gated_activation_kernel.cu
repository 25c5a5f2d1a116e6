// swiglu / geglu CUDA kernels and their registration; checks, layout and
// allocation are shared with the CPU and Meta backends
// (cpp/ops/gated_activation.cpp). Every tensor is a [rows, H] view with
// contiguous rows, so the halves of a packed tensor are used in place.

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "activation_math.cuh"
#include "elementwise.cuh"
#include "ops/gated_activation.h"
#include "ops_generated/cuda/gated_activation.h"

namespace fuseops::cuda {
namespace {

template <typename T>
struct RowPtr {
  T* data;
  int64_t stride;
  __device__ T* at(int64_t row, int64_t col) const { return data + row * stride + col; }
};

template <typename scalar_t>
RowPtr<const scalar_t> rows_of(const at::Tensor& t) {
  return {t.const_data_ptr<scalar_t>(), t.stride(0)};
}

template <typename scalar_t>
RowPtr<scalar_t> mutable_rows_of(const at::Tensor& t) {
  return {t.mutable_data_ptr<scalar_t>(), t.stride(0)};
}

// 16-byte vectors are used when no vector straddles two rows and every row
// start is aligned.
template <typename scalar_t>
bool rows_vectorizable(int64_t cols, std::initializer_list<at::Tensor> views) {
  if (!can_vectorize<scalar_t>(cols, {})) {
    return false;
  }
  for (const at::Tensor& t : views) {
    if (!can_vectorize<scalar_t>(t.stride(0), {t.const_data_ptr()})) {
      return false;
    }
  }
  return true;
}

template <int kVec, Activation kAct, typename scalar_t>
__global__ void gated_forward_kernel(int64_t rows, int64_t cols, RowPtr<scalar_t> out,
                                     RowPtr<const scalar_t> gate, RowPtr<const scalar_t> up) {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = AlignedVector<scalar_t, kVec>;
  const int64_t n = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kVec;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
       base < n; base += stride) {
    const int64_t row = base / cols;
    const int64_t col = base % cols;
    const Vec a = *reinterpret_cast<const Vec*>(gate.at(row, col));
    const Vec b = *reinterpret_cast<const Vec*>(up.at(row, col));
    Vec result;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      result.val[j] =
          static_cast<scalar_t>(activation_value<kAct>(static_cast<opmath_t>(a.val[j])) *
                                static_cast<opmath_t>(b.val[j]));
    }
    *reinterpret_cast<Vec*>(out.at(row, col)) = result;
  }
}

template <int kVec, Activation kAct, typename scalar_t>
__global__ void gated_backward_kernel_impl(int64_t rows, int64_t cols, RowPtr<scalar_t> grad_gate,
                                           RowPtr<scalar_t> grad_up,
                                           RowPtr<const scalar_t> grad_output,
                                           RowPtr<const scalar_t> gate, RowPtr<const scalar_t> up) {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = AlignedVector<scalar_t, kVec>;
  const int64_t n = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kVec;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
       base < n; base += stride) {
    const int64_t row = base / cols;
    const int64_t col = base % cols;
    const Vec g = *reinterpret_cast<const Vec*>(grad_output.at(row, col));
    const Vec a = *reinterpret_cast<const Vec*>(gate.at(row, col));
    const Vec b = *reinterpret_cast<const Vec*>(up.at(row, col));
    Vec d_gate;
    Vec d_up;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const opmath_t grad = static_cast<opmath_t>(g.val[j]);
      opmath_t value;
      const opmath_t derivative =
          activation_derivative<kAct>(static_cast<opmath_t>(a.val[j]), &value);
      d_gate.val[j] = static_cast<scalar_t>(grad * static_cast<opmath_t>(b.val[j]) * derivative);
      d_up.val[j] = static_cast<scalar_t>(grad * value);
    }
    *reinterpret_cast<Vec*>(grad_gate.at(row, col)) = d_gate;
    *reinterpret_cast<Vec*>(grad_up.at(row, col)) = d_up;
  }
}

void gated_kernel(const at::Tensor& out, const at::Tensor& gate, const at::Tensor& up,
                  Activation activation) {
  c10::cuda::CUDAGuard device_guard(gate.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, gate.scalar_type(), "fuseops::gated_activation", [&] {
        constexpr int kVec = 16 / sizeof(scalar_t);
        const int64_t rows = gate.size(0);
        const int64_t cols = gate.size(1);
        const bool vectorizable = rows_vectorizable<scalar_t>(cols, {out, gate, up});
        auto stream = c10::cuda::getCurrentCUDAStream();
        dispatch_activation(activation, [&](auto act) {
          constexpr Activation kAct = decltype(act)::value;
          if (vectorizable) {
            gated_forward_kernel<kVec, kAct>
                <<<blocks_for(rows * cols / kVec), kThreadsPerBlock, 0, stream>>>(
                    rows, cols, mutable_rows_of<scalar_t>(out), rows_of<scalar_t>(gate),
                    rows_of<scalar_t>(up));
          } else {
            gated_forward_kernel<1, kAct><<<blocks_for(rows * cols), kThreadsPerBlock, 0, stream>>>(
                rows, cols, mutable_rows_of<scalar_t>(out), rows_of<scalar_t>(gate),
                rows_of<scalar_t>(up));
          }
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
      });
}

void gated_backward_kernel(const at::Tensor& grad_gate, const at::Tensor& grad_up,
                           const at::Tensor& grad_output, const at::Tensor& gate,
                           const at::Tensor& up, Activation activation) {
  c10::cuda::CUDAGuard device_guard(gate.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, gate.scalar_type(), "fuseops::gated_activation_backward", [&] {
        constexpr int kVec = 16 / sizeof(scalar_t);
        const int64_t rows = gate.size(0);
        const int64_t cols = gate.size(1);
        const bool vectorizable =
            rows_vectorizable<scalar_t>(cols, {grad_gate, grad_up, grad_output, gate, up});
        auto stream = c10::cuda::getCurrentCUDAStream();
        dispatch_activation(activation, [&](auto act) {
          constexpr Activation kAct = decltype(act)::value;
          if (vectorizable) {
            gated_backward_kernel_impl<kVec, kAct>
                <<<blocks_for(rows * cols / kVec), kThreadsPerBlock, 0, stream>>>(
                    rows, cols, mutable_rows_of<scalar_t>(grad_gate),
                    mutable_rows_of<scalar_t>(grad_up), rows_of<scalar_t>(grad_output),
                    rows_of<scalar_t>(gate), rows_of<scalar_t>(up));
          } else {
            gated_backward_kernel_impl<1, kAct>
                <<<blocks_for(rows * cols), kThreadsPerBlock, 0, stream>>>(
                    rows, cols, mutable_rows_of<scalar_t>(grad_gate),
                    mutable_rows_of<scalar_t>(grad_up), rows_of<scalar_t>(grad_output),
                    rows_of<scalar_t>(gate), rows_of<scalar_t>(up));
          }
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
      });
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(GatedActivationCudaKernels::forward, &gated_kernel);
FUSEOPS_REGISTER_KERNEL(GatedActivationCudaKernels::backward, &gated_backward_kernel);

}  // namespace fuseops::cuda
