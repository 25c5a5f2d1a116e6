// swiglu / geglu CUDA kernels and their registration; checks, layout and
// allocation are shared with the CPU and Meta backends
// (cpp/ops/gated_activation.cpp). Every tensor is a [rows, H] view with
// contiguous rows, so the halves of a packed tensor are used in place.

#include <type_traits>

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
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

// Calls fn(row, col) for each run of kVec elements of a [rows, cols] view
// (cols a multiple of kVec), in a grid-stride loop.
template <int kVec, typename Fn>
__device__ void for_each_row_vector(int64_t rows, int64_t cols, const Fn& fn) {
  const int64_t n = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kVec;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
       base < n; base += stride) {
    fn(base / cols, base % cols);
  }
}

// Calls launch(vec, blocks) with vec a std::integral_constant<int, kVec>:
// 16-byte vectors where `vectorizable`, single elements otherwise, and the
// blocks for a thread per vector of rows x cols; then checks the launch.
template <typename scalar_t, typename Launch>
void launch_by_vector_width(bool vectorizable, int64_t rows, int64_t cols, const Launch& launch) {
  constexpr int kVec = 16 / sizeof(scalar_t);
  if (vectorizable) {
    launch(std::integral_constant<int, kVec>{}, blocks_for(rows * cols / kVec));
  } else {
    launch(std::integral_constant<int, 1>{}, blocks_for(rows * cols));
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <int kVec, Activation kAct, typename scalar_t>
__global__ void gated_forward_kernel(int64_t rows, int64_t cols, RowPtr<scalar_t> out,
                                     RowPtr<const scalar_t> gate, RowPtr<const scalar_t> up) {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = AlignedVector<scalar_t, kVec>;
  for_each_row_vector<kVec>(rows, cols, [&](int64_t row, int64_t col) {
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
  });
}

template <int kVec, Activation kAct, typename scalar_t>
__global__ void gated_backward_kernel_impl(int64_t rows, int64_t cols, RowPtr<scalar_t> grad_gate,
                                           RowPtr<scalar_t> grad_up,
                                           RowPtr<const scalar_t> grad_output,
                                           RowPtr<const scalar_t> gate, RowPtr<const scalar_t> up) {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = AlignedVector<scalar_t, kVec>;
  for_each_row_vector<kVec>(rows, cols, [&](int64_t row, int64_t col) {
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
  });
}

void gated_kernel(const at::Tensor& out, const at::Tensor& gate, const at::Tensor& up,
                  Activation activation) {
  c10::cuda::CUDAGuard device_guard(gate.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, gate.scalar_type(), "fuseops::gated_activation", [&] {
        const int64_t rows = gate.size(0);
        const int64_t cols = gate.size(1);
        const bool vectorizable = rows_vectorizable<scalar_t>(cols, {out, gate, up});
        dispatch_activation(activation, [&](auto act) {
          constexpr Activation kAct = decltype(act)::value;
          launch_by_vector_width<scalar_t>(vectorizable, rows, cols, [&](auto vec, int64_t blocks) {
            gated_forward_kernel<decltype(vec)::value, kAct>
                <<<blocks, kThreadsPerBlock, 0, c10::cuda::getCurrentCUDAStream()>>>(
                    rows, cols, mutable_rows_of<scalar_t>(out), rows_of<scalar_t>(gate),
                    rows_of<scalar_t>(up));
          });
        });
      });
}

void gated_backward_kernel(const at::Tensor& grad_gate, const at::Tensor& grad_up,
                           const at::Tensor& grad_output, const at::Tensor& gate,
                           const at::Tensor& up, Activation activation) {
  c10::cuda::CUDAGuard device_guard(gate.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, gate.scalar_type(), "fuseops::gated_activation_backward", [&] {
        const int64_t rows = gate.size(0);
        const int64_t cols = gate.size(1);
        const bool vectorizable =
            rows_vectorizable<scalar_t>(cols, {grad_gate, grad_up, grad_output, gate, up});
        dispatch_activation(activation, [&](auto act) {
          constexpr Activation kAct = decltype(act)::value;
          launch_by_vector_width<scalar_t>(vectorizable, rows, cols, [&](auto vec, int64_t blocks) {
            gated_backward_kernel_impl<decltype(vec)::value, kAct>
                <<<blocks, kThreadsPerBlock, 0, c10::cuda::getCurrentCUDAStream()>>>(
                    rows, cols, mutable_rows_of<scalar_t>(grad_gate),
                    mutable_rows_of<scalar_t>(grad_up), rows_of<scalar_t>(grad_output),
                    rows_of<scalar_t>(gate), rows_of<scalar_t>(up));
          });
        });
      });
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(GatedActivationCudaKernels::forward, &gated_kernel);
FUSEOPS_REGISTER_KERNEL(GatedActivationCudaKernels::backward, &gated_backward_kernel);

}  // namespace fuseops::cuda
