// layer_norm CUDA kernels and their registration; checks and allocation are
// shared with the CPU and Meta backends (cpp/ops/layer_norm.cpp).
//
// Forward: one block per row; the row's sum, then its sum of squared
// deviations (two exact passes, the second from L1/L2), block reductions in
// float32 (float64 for float64), 16-byte loads where the row allows.
// Backward: a grid of a few blocks per SM walks the rows; each thread owns a
// fixed set of columns and accumulates their weight and bias gradients in
// shared memory (global memory for rows too long for it) while it writes
// grad_input, so x and grad_output are read once. A second, small kernel adds
// the blocks' partial sums.

#include <algorithm>
#include <cstdint>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "elementwise.cuh"
#include "ops/layer_norm.h"
#include "ops_generated/cuda/layer_norm.h"

namespace fuseops::cuda {
namespace {

constexpr int kMaxThreads = 512;
constexpr int kMaxWarps = kMaxThreads / kWarpSize;

// Sum of `value` over the block (blockDim.x a multiple of 32), returned to
// every thread. `shared` holds one value per warp.
template <typename acc_t>
__device__ acc_t block_sum(acc_t value, acc_t* shared) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  value = warp_sum(value);
  // The previous call's readers must be done with `shared`.
  __syncthreads();
  if (lane == 0) {
    shared[warp] = value;
  }
  __syncthreads();
  value = lane < static_cast<int>(blockDim.x / kWarpSize) ? shared[lane] : acc_t(0);
  return warp_sum(value);
}

// Maximum of `value` (not NaN) over the block, returned to every thread.
template <typename acc_t>
__device__ acc_t block_max(acc_t value, acc_t* shared) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = max(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  __syncthreads();
  if (lane == 0) {
    shared[warp] = value;
  }
  __syncthreads();
  value = lane < static_cast<int>(blockDim.x / kWarpSize) ? shared[lane] : acc_t(0);
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = max(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

// a * b rounded, never fused into a following add: grad_input subtracts
// mean(g) from each g = dy * w, and a fused multiply-add there would leave
// the product's rounding error (times rstd, ~316 for eps 1e-5 on a constant
// row) where the exact result is 0.
__device__ __forceinline__ float rounded_product(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double rounded_product(double a, double b) { return __dmul_rn(a, b); }

template <typename T, int kVec>
__device__ AlignedVector<T, kVec> load_vec(const T* data, int64_t chunk) {
  return reinterpret_cast<const AlignedVector<T, kVec>*>(data)[chunk];
}

template <typename T, int kVec>
__device__ void store_vec(T* data, int64_t chunk, const AlignedVector<T, kVec>& v) {
  reinterpret_cast<AlignedVector<T, kVec>*>(data)[chunk] = v;
}

// Threads per block for rows of `chunks` vectors: enough for one vector per
// thread, a multiple of the warp size, at most kMaxThreads.
int threads_for(int64_t chunks) {
  const int64_t rounded = (chunks + kWarpSize - 1) / kWarpSize * kWarpSize;
  return static_cast<int>(std::clamp<int64_t>(rounded, kWarpSize, kMaxThreads));
}

// hidden % kVec == 0 for kVec > 1; weight and bias may be nullptr.
template <typename T, int kVec>
__global__ void layer_norm_forward_kernel(T* __restrict__ out,
                                          at::opmath_type<T>* __restrict__ mean,
                                          at::opmath_type<T>* __restrict__ rstd,
                                          const T* __restrict__ input, const T* __restrict__ weight,
                                          const T* __restrict__ bias, int64_t rows, int64_t hidden,
                                          at::opmath_type<T> eps) {
  using acc_t = at::opmath_type<T>;
  __shared__ acc_t shared[kMaxWarps];
  const int64_t chunks = hidden / kVec;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = input + row * hidden;
    T* y = out + row * hidden;

    acc_t sum = 0;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const auto v = load_vec<T, kVec>(x, c);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        sum += static_cast<acc_t>(v.val[k]);
      }
    }
    const acc_t rough_mean = block_sum(sum, shared) / static_cast<acc_t>(hidden);

    // The corrected two-pass algorithm, as in the CPU kernel: the sum of the
    // deviations from the rough mean removes its rounding (constant rows
    // normalise to exactly 0 even with eps = 1e-12).
    acc_t deviations = 0;
    acc_t squares = 0;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const auto v = load_vec<T, kVec>(x, c);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const acc_t d = static_cast<acc_t>(v.val[k]) - rough_mean;
        deviations += d;
        squares += d * d;
      }
    }
    acc_t sum_d = block_sum(deviations, shared);
    acc_t sum_sq = block_sum(squares, shared);
    const acc_t count = static_cast<acc_t>(hidden);
    const acc_t row_mean = rough_mean + sum_d / count;
    // Rows whose squared deviations overflow (|x| ~ 1e20 and up in float32)
    // are measured again in units of their largest deviation, as on the CPU
    // (the sums are the same on every thread, so the whole block branches).
    acc_t scale = 1;
    if (isinf(sum_sq) && isfinite(row_mean)) {
      acc_t largest = 0;
      for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
        const auto v = load_vec<T, kVec>(x, c);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          largest = max(largest, abs(static_cast<acc_t>(v.val[k]) - row_mean));
        }
      }
      scale = block_max(largest, shared);
      deviations = 0;
      squares = 0;
      for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
        const auto v = load_vec<T, kVec>(x, c);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const acc_t d = (static_cast<acc_t>(v.val[k]) - row_mean) / scale;
          deviations += d;
          squares += d * d;
        }
      }
      sum_d = block_sum(deviations, shared);
      sum_sq = block_sum(squares, shared);
    }
    const acc_t variance = max(acc_t(0), (sum_sq - sum_d * sum_d / count) / count);
    // 1 / (scale * sqrt(variance + eps / scale^2)) is 1 / sqrt(scale^2 *
    // variance + eps) without forming scale^2 * variance.
    const acc_t row_rstd = acc_t(1) / (scale * sqrt(variance + eps / (scale * scale)));
    if (threadIdx.x == 0 && mean != nullptr) {
      mean[row] = row_mean;
      rstd[row] = row_rstd;
    }

    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const auto v = load_vec<T, kVec>(x, c);
      AlignedVector<T, kVec> w, b, result;
      if (weight != nullptr) {
        w = load_vec<T, kVec>(weight, c);
      }
      if (bias != nullptr) {
        b = load_vec<T, kVec>(bias, c);
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        acc_t value = (static_cast<acc_t>(v.val[k]) - row_mean) * row_rstd;
        if (weight != nullptr) {
          value *= static_cast<acc_t>(w.val[k]);
        }
        if (bias != nullptr) {
          value += static_cast<acc_t>(b.val[k]);
        }
        result.val[k] = static_cast<T>(value);
      }
      store_vec<T, kVec>(y, c, result);
    }
  }
}

// Calls fn(k, x_hat, dy, g) for element k of vector `c` of a row: x_hat =
// (x - mean) * rstd, dy, and g = dy * weight (rounded once; dy without a
// weight), the terms both passes of the backward read.
template <typename T, int kVec, typename acc_t, typename Fn>
__device__ __forceinline__ void backward_terms(const T* x, const T* dy, const T* weight, int64_t c,
                                               acc_t mean, acc_t rstd, const Fn& fn) {
  const auto xv = load_vec<T, kVec>(x, c);
  const auto dyv = load_vec<T, kVec>(dy, c);
  AlignedVector<T, kVec> w;
  if (weight != nullptr) {
    w = load_vec<T, kVec>(weight, c);
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const acc_t x_hat = (static_cast<acc_t>(xv.val[k]) - mean) * rstd;
    const acc_t d = static_cast<acc_t>(dyv.val[k]);
    const acc_t g = weight != nullptr ? rounded_product(d, static_cast<acc_t>(w.val[k])) : d;
    fn(k, x_hat, d, g);
  }
}

// Each block walks rows blockIdx.x, blockIdx.x + gridDim.x, ...; thread t owns
// the vectors t, t + blockDim.x, ... of every row and sums their weight and
// bias gradients in `accumulators` (2 * hidden values: shared memory, laid
// out vector-index-major so that a warp's accesses hit distinct banks, or
// this block's slice of `partials` in column order when `in_shared` is false).
// The block's sums end up in partials[blockIdx.x] = [grad_weight | grad_bias].
// No __restrict__ on grad_input, grad_output and input:
// layer_norm_backward.out may write grad_input over either (each element is
// read before the same thread writes it).
template <typename T, int kVec>
__global__ void layer_norm_backward_kernel(T* grad_input, at::opmath_type<T>* __restrict__ partials,
                                           const T* grad_output, const T* input,
                                           const T* __restrict__ weight,
                                           const at::opmath_type<T>* __restrict__ mean,
                                           const at::opmath_type<T>* __restrict__ rstd,
                                           int64_t rows, int64_t hidden, bool in_shared) {
  using acc_t = at::opmath_type<T>;
  __shared__ acc_t shared_g[kMaxWarps];
  __shared__ acc_t shared_gx[kMaxWarps];
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  const int64_t chunks = hidden / kVec;
  acc_t* block_partials = partials + blockIdx.x * 2 * hidden;
  acc_t* accumulators = in_shared ? reinterpret_cast<acc_t*>(dynamic_shared) : block_partials;
  auto slot = [&](int64_t c, int k) { return in_shared ? k * chunks + c : c * kVec + k; };
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      accumulators[slot(c, k)] = 0;
      accumulators[hidden + slot(c, k)] = 0;
    }
  }

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = input + row * hidden;
    const T* dy = grad_output + row * hidden;
    T* dx = grad_input + row * hidden;
    const acc_t row_mean = mean[row];
    const acc_t row_rstd = rstd[row];

    acc_t sum_g = 0;
    acc_t sum_gx = 0;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      backward_terms<T, kVec>(x, dy, weight, c, row_mean, row_rstd,
                              [&](int k, acc_t x_hat, acc_t d, acc_t g) {
                                sum_g += g;
                                sum_gx += g * x_hat;
                                accumulators[slot(c, k)] += d * x_hat;
                                accumulators[hidden + slot(c, k)] += d;
                              });
    }
    sum_g = block_sum(sum_g, shared_g);
    sum_gx = block_sum(sum_gx, shared_gx);
    // grad_input = rstd * (g - mean(g) - x_hat * mean(g * x_hat)).
    const acc_t mean_g = sum_g / static_cast<acc_t>(hidden);
    const acc_t mean_gx = sum_gx / static_cast<acc_t>(hidden);
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      AlignedVector<T, kVec> result;
      backward_terms<T, kVec>(
          x, dy, weight, c, row_mean, row_rstd, [&](int k, acc_t x_hat, acc_t /*d*/, acc_t g) {
            result.val[k] = static_cast<T>((g - mean_g - x_hat * mean_gx) * row_rstd);
          });
      store_vec<T, kVec>(dx, c, result);
    }
  }

  if (in_shared) {
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        block_partials[c * kVec + k] = accumulators[slot(c, k)];
        block_partials[hidden + c * kVec + k] = accumulators[hidden + slot(c, k)];
      }
    }
  }
}

constexpr int kReduceColumns = 32;
constexpr int kReduceRows = 16;

// out[j] = sum over b of partials[b * 2 * hidden + offset + j], with
// offset = 0 (grad_weight) for blockIdx.y == 0 and hidden (grad_bias) for 1.
template <typename T>
__global__ void sum_partials_kernel(T* __restrict__ grad_weight, T* __restrict__ grad_bias,
                                    const at::opmath_type<T>* __restrict__ partials, int64_t blocks,
                                    int64_t hidden) {
  using acc_t = at::opmath_type<T>;
  __shared__ acc_t sums[kReduceRows][kReduceColumns + 1];
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kReduceColumns + threadIdx.x;
  const int64_t offset = blockIdx.y == 0 ? 0 : hidden;
  acc_t sum = 0;
  if (column < hidden) {
    for (int64_t b = threadIdx.y; b < blocks; b += kReduceRows) {
      sum += partials[b * 2 * hidden + offset + column];
    }
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && column < hidden) {
    acc_t total = 0;
#pragma unroll
    for (int r = 0; r < kReduceRows; ++r) {
      total += sums[r][threadIdx.x];
    }
    (blockIdx.y == 0 ? grad_weight : grad_bias)[column] = static_cast<T>(total);
  }
}

int device_attribute(cudaDeviceAttr attribute, int device) {
  int value = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

template <typename T>
const T* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr<T>() : nullptr;
}

void layer_norm_kernel(const at::Tensor& out, const at::Tensor& mean, const at::Tensor& rstd,
                       const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                       double eps) {
  c10::cuda::CUDAGuard device_guard(input.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::layer_norm", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const int64_t hidden = input.size(-1);
        const int64_t rows = input.numel() / hidden;
        scalar_t* y = out.mutable_data_ptr<scalar_t>();
        const scalar_t* x = input.const_data_ptr<scalar_t>();
        const scalar_t* w = data_or_null<scalar_t>(weight);
        const scalar_t* b = data_or_null<scalar_t>(bias);
        acc_t* mean_data = mean.defined() ? mean.mutable_data_ptr<acc_t>() : nullptr;
        acc_t* rstd_data = rstd.defined() ? rstd.mutable_data_ptr<acc_t>() : nullptr;
        const int vec = can_vectorize<scalar_t>(hidden, {y, x, w, b})
                            ? static_cast<int>(16 / sizeof(scalar_t))
                            : 1;
        const int threads = threads_for(hidden / vec);
        const auto grid = static_cast<unsigned>(std::min<int64_t>(rows, INT32_MAX));
        auto stream = c10::cuda::getCurrentCUDAStream();
        if (vec > 1) {
          constexpr int kVec = 16 / sizeof(scalar_t);
          layer_norm_forward_kernel<scalar_t, kVec><<<grid, threads, 0, stream>>>(
              y, mean_data, rstd_data, x, w, b, rows, hidden, static_cast<acc_t>(eps));
        } else {
          layer_norm_forward_kernel<scalar_t, 1><<<grid, threads, 0, stream>>>(
              y, mean_data, rstd_data, x, w, b, rows, hidden, static_cast<acc_t>(eps));
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

template <typename T, int kVec>
void launch_backward(T* dx, at::opmath_type<T>* partials, const T* dy, const T* x, const T* w,
                     const at::opmath_type<T>* mean, const at::opmath_type<T>* rstd, int64_t rows,
                     int64_t hidden, int64_t blocks, int device, cudaStream_t stream) {
  using acc_t = at::opmath_type<T>;
  auto kernel = layer_norm_backward_kernel<T, kVec>;
  // The block reductions' static arrays share the per-block limit.
  constexpr int64_t kStaticShared = 2 * kMaxWarps * sizeof(acc_t);
  const int64_t accumulator_bytes = 2 * hidden * static_cast<int64_t>(sizeof(acc_t));
  const int64_t shared_limit =
      device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device) - kStaticShared;
  const bool in_shared = accumulator_bytes <= shared_limit;
  const int shared_bytes = in_shared ? static_cast<int>(accumulator_bytes) : 0;
  if (shared_bytes > 48 * 1024) {
    C10_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  }
  kernel<<<static_cast<unsigned>(blocks), threads_for(hidden / kVec), shared_bytes, stream>>>(
      dx, partials, dy, x, w, mean, rstd, rows, hidden, in_shared);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void layer_norm_backward_kernel_launch(const at::Tensor& grad_input, const at::Tensor& grad_weight,
                                       const at::Tensor& grad_bias, const at::Tensor& grad_output,
                                       const at::Tensor& input, const at::Tensor& weight,
                                       const at::Tensor& mean, const at::Tensor& rstd) {
  c10::cuda::CUDAGuard device_guard(input.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::layer_norm_backward", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const int64_t hidden = input.size(-1);
        const int64_t rows = input.numel() / hidden;
        const int device = input.get_device();
        // A few blocks per SM keep the loads in flight; more would only add
        // partial sums to add up.
        const int64_t blocks = std::min<int64_t>(
            rows,
            2 * static_cast<int64_t>(device_attribute(cudaDevAttrMultiProcessorCount, device)));
        at::Tensor partials =
            at::empty({blocks, 2, hidden}, input.options().dtype(mean.scalar_type()));
        scalar_t* dx = grad_input.mutable_data_ptr<scalar_t>();
        const scalar_t* dy = grad_output.const_data_ptr<scalar_t>();
        const scalar_t* x = input.const_data_ptr<scalar_t>();
        const scalar_t* w = data_or_null<scalar_t>(weight);
        acc_t* partial_data = partials.mutable_data_ptr<acc_t>();
        const acc_t* mean_data = mean.const_data_ptr<acc_t>();
        const acc_t* rstd_data = rstd.const_data_ptr<acc_t>();
        auto stream = c10::cuda::getCurrentCUDAStream();
        if (can_vectorize<scalar_t>(hidden, {dx, dy, x, w})) {
          launch_backward<scalar_t, 16 / sizeof(scalar_t)>(dx, partial_data, dy, x, w, mean_data,
                                                           rstd_data, rows, hidden, blocks, device,
                                                           stream);
        } else {
          launch_backward<scalar_t, 1>(dx, partial_data, dy, x, w, mean_data, rstd_data, rows,
                                       hidden, blocks, device, stream);
        }
        const dim3 reduce_grid(
            static_cast<unsigned>((hidden + kReduceColumns - 1) / kReduceColumns), 2);
        const dim3 reduce_block(kReduceColumns, kReduceRows);
        sum_partials_kernel<scalar_t><<<reduce_grid, reduce_block, 0, stream>>>(
            grad_weight.mutable_data_ptr<scalar_t>(), grad_bias.mutable_data_ptr<scalar_t>(),
            partial_data, blocks, hidden);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(LayerNormCudaKernels::forward, &layer_norm_kernel);
FUSEOPS_REGISTER_KERNEL(LayerNormCudaKernels::backward, &layer_norm_backward_kernel_launch);

}  // namespace fuseops::cuda
