// rms_norm / fused_add_rms_norm CUDA kernels and their registration; checks
// and allocation are shared with the CPU and Meta backends
// (cpp/ops/rms_norm.cpp).
//
// A row is handled by one warp when it is short (up to 4 vectors per lane)
// and by a block of 8 warps otherwise; lanes read 16-byte vectors when the
// row width and every pointer allow it. Sums are float32 (float64 for
// double), reduced with warp shuffles and then across the block's warps.
// The backward accumulates the weight gradient of the rows one row group
// handles into that group's row of a float32 partial-sum buffer, and a
// second small kernel adds the partial rows.

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <torch/library.h>

#include "elementwise.cuh"
#include "ops/rms_norm.h"
#include "ops_generated/cuda/rms_norm.h"

namespace fuseops::cuda {
namespace {

constexpr int kBlockThreads = 256;
constexpr int kWarpsPerBlock = kBlockThreads / kWarpSize;

// Sum over the lanes that share a row: one warp, or the whole block (then
// blockDim.y == 1 and every thread of the block works on the same row).
template <int kWarpsPerRow, typename T>
__device__ __forceinline__ T row_sum(T value, T* shared) {
  value = warp_sum(value);
  if constexpr (kWarpsPerRow == 1) {
    return value;
  } else {
    const int warp = threadIdx.x / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    __syncthreads();  // the previous row's readers are done with `shared`
    if (lane == 0) {
      shared[warp] = value;
    }
    __syncthreads();
    T total = 0;
#pragma unroll
    for (int w = 0; w < kWarpsPerRow; ++w) {
      total += shared[w];
    }
    return total;
  }
}

template <typename T, int kVec>
__device__ __forceinline__ AlignedVector<T, kVec> load_vec(const T* p) {
  return *reinterpret_cast<const AlignedVector<T, kVec>*>(p);
}

template <typename T, int kVec>
__device__ __forceinline__ void store_vec(T* p, const AlignedVector<T, kVec>& v) {
  *reinterpret_cast<AlignedVector<T, kVec>*>(p) = v;
}

// Rows are assigned to row groups: blockDim.y groups per block, each of
// blockDim.x lanes; the grid strides over rows.
__device__ __forceinline__ int64_t row_group() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
}
__device__ __forceinline__ int64_t row_groups() {
  return static_cast<int64_t>(gridDim.x) * blockDim.y;
}

template <typename scalar_t, int kVec, int kWarpsPerRow>
__global__ void rms_norm_forward_kernel(int64_t rows, int64_t hidden, at::opmath_type<scalar_t> eps,
                                        // No __restrict__: the out= overloads
                                        // may write in place.
                                        const scalar_t* input, const scalar_t* residual,
                                        const at::opmath_type<scalar_t>* weight, scalar_t* out,
                                        scalar_t* residual_out,
                                        at::opmath_type<scalar_t>* __restrict__ rstd_out) {
  using opmath_t = at::opmath_type<scalar_t>;
  __shared__ opmath_t shared[kWarpsPerRow];
  const int64_t vecs = hidden / kVec;
  for (int64_t row = row_group(); row < rows; row += row_groups()) {
    const int64_t offset = row * hidden;
    opmath_t sum_sq = 0;
    for (int64_t v = threadIdx.x; v < vecs; v += blockDim.x) {
      auto a = load_vec<scalar_t, kVec>(input + offset + v * kVec);
      if (residual != nullptr) {
        const auto b = load_vec<scalar_t, kVec>(residual + offset + v * kVec);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          a.val[j] = static_cast<scalar_t>(static_cast<opmath_t>(a.val[j]) +
                                           static_cast<opmath_t>(b.val[j]));
        }
        store_vec(residual_out + offset + v * kVec, a);
      }
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const opmath_t f = static_cast<opmath_t>(a.val[j]);
        sum_sq += f * f;
      }
    }
    sum_sq = row_sum<kWarpsPerRow>(sum_sq, shared);
    const opmath_t rstd = opmath_t(1) / ::sqrt(sum_sq / static_cast<opmath_t>(hidden) + eps);
    if (rstd_out != nullptr && threadIdx.x == 0) {
      rstd_out[row] = rstd;
    }
    // Each lane rereads the very elements it wrote to residual_out.
    const scalar_t* normalized = residual != nullptr ? residual_out : input;
    for (int64_t v = threadIdx.x; v < vecs; v += blockDim.x) {
      const auto a = load_vec<scalar_t, kVec>(normalized + offset + v * kVec);
      AlignedVector<scalar_t, kVec> o;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        opmath_t y = static_cast<opmath_t>(a.val[j]) * rstd;
        if (weight != nullptr) {
          y *= weight[v * kVec + j];
        }
        o.val[j] = static_cast<scalar_t>(y);
      }
      store_vec(out + offset + v * kVec, o);
    }
  }
}

// grad_x = rstd * (g*w - x * rstd^2 * mean(g*w*x)) [+ grad_residual];
// partial[group] += g * x * rstd.
template <typename scalar_t, int kVec, int kWarpsPerRow>
__global__ void rms_norm_backward_kernel(
    // No __restrict__ on grad, grad_residual, input and grad_input: the
    // backward out= overloads may write grad_input over grad, grad_residual
    // or input (each element is read first).
    int64_t rows, int64_t hidden, const scalar_t* grad, const scalar_t* grad_residual,
    const scalar_t* input, const at::opmath_type<scalar_t>* __restrict__ weight,
    const at::opmath_type<scalar_t>* __restrict__ rstd, scalar_t* grad_input,
    at::opmath_type<scalar_t>* __restrict__ weight_partials) {
  using opmath_t = at::opmath_type<scalar_t>;
  __shared__ opmath_t shared[kWarpsPerRow];
  const int64_t vecs = hidden / kVec;
  opmath_t* partial = weight_partials != nullptr ? weight_partials + row_group() * hidden : nullptr;
  for (int64_t row = row_group(); row < rows; row += row_groups()) {
    const int64_t offset = row * hidden;
    opmath_t dot = 0;
    for (int64_t v = threadIdx.x; v < vecs; v += blockDim.x) {
      const auto g = load_vec<scalar_t, kVec>(grad + offset + v * kVec);
      const auto x = load_vec<scalar_t, kVec>(input + offset + v * kVec);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        opmath_t gw = static_cast<opmath_t>(g.val[j]);
        if (weight != nullptr) {
          gw *= weight[v * kVec + j];
        }
        dot += gw * static_cast<opmath_t>(x.val[j]);
      }
    }
    dot = row_sum<kWarpsPerRow>(dot, shared);
    const opmath_t r = rstd[row];
    const opmath_t c = r * r * dot / static_cast<opmath_t>(hidden);
    for (int64_t v = threadIdx.x; v < vecs; v += blockDim.x) {
      const auto g = load_vec<scalar_t, kVec>(grad + offset + v * kVec);
      const auto x = load_vec<scalar_t, kVec>(input + offset + v * kVec);
      AlignedVector<scalar_t, kVec> gr;
      if (grad_residual != nullptr) {
        gr = load_vec<scalar_t, kVec>(grad_residual + offset + v * kVec);
      }
      AlignedVector<scalar_t, kVec> gx;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const opmath_t gf = static_cast<opmath_t>(g.val[j]);
        const opmath_t xf = static_cast<opmath_t>(x.val[j]);
        opmath_t gw = gf;
        if (weight != nullptr) {
          gw *= weight[v * kVec + j];
          partial[v * kVec + j] += gf * xf * r;
        }
        opmath_t d = r * (gw - xf * c);
        if (grad_residual != nullptr) {
          d += static_cast<opmath_t>(gr.val[j]);
        }
        gx.val[j] = static_cast<scalar_t>(d);
      }
      store_vec(grad_input + offset + v * kVec, gx);
    }
  }
}

// grad_weight[j] = sum over groups of partials[group][j]: 32 columns per
// block, 16 lanes per column striding over the groups, then a shared-memory
// sum of the 16.
constexpr int kReduceColumns = 32;
constexpr int kReduceLanes = 16;

template <typename opmath_t>
__global__ void sum_weight_partials_kernel(int64_t groups, int64_t hidden,
                                           const opmath_t* __restrict__ partials,
                                           opmath_t* __restrict__ grad_weight) {
  __shared__ opmath_t tile[kReduceLanes][kReduceColumns + 1];
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kReduceColumns + threadIdx.x;
  opmath_t sum = 0;
  if (column < hidden) {
    for (int64_t g = threadIdx.y; g < groups; g += kReduceLanes) {
      sum += partials[g * hidden + column];
    }
  }
  tile[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && column < hidden) {
    opmath_t total = 0;
#pragma unroll
    for (int i = 0; i < kReduceLanes; ++i) {
      total += tile[i][threadIdx.x];
    }
    grad_weight[column] = total;
  }
}

struct Launch {
  dim3 grid;
  dim3 block;
  bool warp_per_row;
};

int multiprocessor_count(int device) {
  int count = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

// `max_blocks` bounds the grid (the backward's partial-sum buffer has one
// row per row group).
Launch launch_shape(int64_t rows, int64_t vecs, int64_t max_blocks) {
  // Up to 4 vectors per lane of one warp: a warp per row, 8 rows per block.
  const bool warp_per_row = vecs <= 4 * kWarpSize;
  const int64_t rows_per_block = warp_per_row ? kWarpsPerBlock : 1;
  const int64_t blocks =
      std::clamp<int64_t>((rows + rows_per_block - 1) / rows_per_block, 1, max_blocks);
  return warp_per_row ? Launch{dim3(blocks), dim3(kWarpSize, kWarpsPerBlock), true}
                      : Launch{dim3(blocks), dim3(kBlockThreads, 1), false};
}

template <typename scalar_t, int kVec>
void launch_forward(const detail::RmsNormForwardArgs& args, int64_t rows, int64_t hidden) {
  using opmath_t = at::opmath_type<scalar_t>;
  const Launch launch = launch_shape(rows, hidden / kVec, int64_t{1} << 20);
  auto stream = c10::cuda::getCurrentCUDAStream();
  const scalar_t* residual =
      args.residual.defined() ? args.residual.const_data_ptr<scalar_t>() : nullptr;
  scalar_t* residual_out =
      args.residual_out.defined() ? args.residual_out.mutable_data_ptr<scalar_t>() : nullptr;
  const opmath_t* weight = args.weight.defined() ? args.weight.const_data_ptr<opmath_t>() : nullptr;
  opmath_t* rstd = args.rstd.defined() ? args.rstd.mutable_data_ptr<opmath_t>() : nullptr;
  const auto eps = static_cast<opmath_t>(args.eps);
  if (launch.warp_per_row) {
    rms_norm_forward_kernel<scalar_t, kVec, 1><<<launch.grid, launch.block, 0, stream>>>(
        rows, hidden, eps, args.input.const_data_ptr<scalar_t>(), residual, weight,
        args.out.mutable_data_ptr<scalar_t>(), residual_out, rstd);
  } else {
    rms_norm_forward_kernel<scalar_t, kVec, kWarpsPerBlock>
        <<<launch.grid, launch.block, 0, stream>>>(
            rows, hidden, eps, args.input.const_data_ptr<scalar_t>(), residual, weight,
            args.out.mutable_data_ptr<scalar_t>(), residual_out, rstd);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t, int kVec>
void launch_backward(const detail::RmsNormBackwardArgs& args, int64_t rows, int64_t hidden) {
  using opmath_t = at::opmath_type<scalar_t>;
  // A few blocks per multiprocessor keep the device busy while the partial
  // buffer (groups x hidden) stays small enough for L2.
  const int64_t max_blocks = 4 * int64_t{multiprocessor_count(args.input.get_device())};
  const Launch launch = launch_shape(rows, hidden / kVec, max_blocks);
  const int64_t groups = static_cast<int64_t>(launch.grid.x) * launch.block.y;
  auto stream = c10::cuda::getCurrentCUDAStream();
  const bool with_weight = args.weight.defined();
  at::Tensor partials;
  if (with_weight) {
    partials = at::zeros({groups, hidden}, args.grad_weight.options());
  }
  const scalar_t* grad_residual =
      args.grad_residual.defined() ? args.grad_residual.const_data_ptr<scalar_t>() : nullptr;
  const opmath_t* weight = with_weight ? args.weight.const_data_ptr<opmath_t>() : nullptr;
  opmath_t* partial_ptr = with_weight ? partials.mutable_data_ptr<opmath_t>() : nullptr;
  if (launch.warp_per_row) {
    rms_norm_backward_kernel<scalar_t, kVec, 1><<<launch.grid, launch.block, 0, stream>>>(
        rows, hidden, args.grad_output.const_data_ptr<scalar_t>(), grad_residual,
        args.input.const_data_ptr<scalar_t>(), weight, args.rstd.const_data_ptr<opmath_t>(),
        args.grad_input.mutable_data_ptr<scalar_t>(), partial_ptr);
  } else {
    rms_norm_backward_kernel<scalar_t, kVec, kWarpsPerBlock>
        <<<launch.grid, launch.block, 0, stream>>>(
            rows, hidden, args.grad_output.const_data_ptr<scalar_t>(), grad_residual,
            args.input.const_data_ptr<scalar_t>(), weight, args.rstd.const_data_ptr<opmath_t>(),
            args.grad_input.mutable_data_ptr<scalar_t>(), partial_ptr);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (with_weight) {
    const dim3 grid((hidden + kReduceColumns - 1) / kReduceColumns);
    sum_weight_partials_kernel<opmath_t><<<grid, dim3(kReduceColumns, kReduceLanes), 0, stream>>>(
        groups, hidden, partials.const_data_ptr<opmath_t>(),
        args.grad_weight.mutable_data_ptr<opmath_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// 16-byte vectors when the row width is a multiple of the vector and every
// row start is aligned (the opmath weight is read one element at a time).
template <typename scalar_t>
bool vectorizable(int64_t hidden, std::initializer_list<const at::Tensor*> tensors) {
  if (!can_vectorize<scalar_t>(hidden, {})) {
    return false;
  }
  for (const at::Tensor* t : tensors) {
    if (t->defined() && !all_aligned({t->const_data_ptr()})) {
      return false;
    }
  }
  return true;
}

void rms_norm_forward_cuda_kernel(const detail::RmsNormForwardArgs& args) {
  c10::cuda::CUDAGuard device_guard(args.input.device());
  const int64_t hidden = args.input.size(-1);
  const int64_t rows = args.input.numel() / hidden;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, args.input.scalar_type(), "fuseops::rms_norm", [&] {
        constexpr int kVec = 16 / sizeof(scalar_t);
        if (vectorizable<scalar_t>(hidden,
                                   {&args.input, &args.residual, &args.residual_out, &args.out})) {
          launch_forward<scalar_t, kVec>(args, rows, hidden);
        } else {
          launch_forward<scalar_t, 1>(args, rows, hidden);
        }
      });
}

void rms_norm_backward_cuda_kernel(const detail::RmsNormBackwardArgs& args) {
  c10::cuda::CUDAGuard device_guard(args.input.device());
  const int64_t hidden = args.input.size(-1);
  const int64_t rows = args.input.numel() / hidden;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, args.input.scalar_type(), "fuseops::rms_norm_backward", [&] {
        constexpr int kVec = 16 / sizeof(scalar_t);
        if (vectorizable<scalar_t>(
                hidden, {&args.grad_output, &args.grad_residual, &args.input, &args.grad_input})) {
          launch_backward<scalar_t, kVec>(args, rows, hidden);
        } else {
          launch_backward<scalar_t, 1>(args, rows, hidden);
        }
      });
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(RmsNormCudaKernels::forward, &rms_norm_forward_cuda_kernel);
FUSEOPS_REGISTER_KERNEL(RmsNormCudaKernels::backward, &rms_norm_backward_cuda_kernel);

}  // namespace fuseops::cuda
