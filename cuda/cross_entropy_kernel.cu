// cross_entropy CUDA kernels and their registration; checks, allocation and
// linear_cross_entropy's GEMMs are shared with the CPU and Meta backends
// (cpp/ops/cross_entropy.cpp).
//
// One block per row (grid-stride over rows). The first pass keeps, per
// thread, a running maximum and sum of exp(z - max) (online softmax), merged
// across the warp with shuffles and across warps through shared memory; the
// gradient pass reads and writes each element once. Arithmetic is float32
// (float64 for double). The target's element is rewritten by one thread after
// the block is done with the row, in float32. An out-of-range target is a
// device-side assert of the target kernel, which runs before any row is read.

#include <algorithm>
#include <cstdint>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/macros/Macros.h>
#include <cuda_runtime.h>

#include <torch/library.h>

#include "elementwise.cuh"
#include "ops/cross_entropy.h"
#include "ops_generated/cuda/cross_entropy.h"

namespace fuseops::cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int kRowWarps = kRowThreads / kWarpSize;

template <typename acc_t>
__global__ void target_kernel(int64_t rows, const int64_t* __restrict__ target,
                              const acc_t* __restrict__ weight, acc_t* __restrict__ row_weight,
                              int64_t vocab, int64_t ignore_index) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = target[i];
    if (t == ignore_index) {
      row_weight[i] = 0;
      continue;
    }
    // fuseops::cross_entropy: target outside [0, V) and not ignore_index.
    CUDA_KERNEL_ASSERT(t >= 0 && t < vocab);
    row_weight[i] = weight != nullptr ? weight[t] : acc_t(1);
  }
}

template <typename acc_t>
__device__ __forceinline__ acc_t capped(acc_t x, acc_t cap, acc_t inv_cap, bool softcap) {
  return softcap ? cap * ::tanh(x * inv_cap) : x;
}

// (m, s) and a sum over the whole block, returned to every thread.
template <typename acc_t>
__device__ void block_reduce(acc_t& m, acc_t& s, acc_t& sum, acc_t* shared) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    merge_max_sum(m, s, __shfl_xor_sync(0xffffffffu, m, offset),
                  __shfl_xor_sync(0xffffffffu, s, offset));
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  __syncthreads();  // the previous row's readers are done with `shared`
  if (lane == 0) {
    shared[warp] = m;
    shared[kRowWarps + warp] = s;
    shared[2 * kRowWarps + warp] = sum;
  }
  __syncthreads();
  m = shared[0];
  s = shared[kRowWarps];
  sum = shared[2 * kRowWarps];
  for (int w = 1; w < kRowWarps; ++w) {
    merge_max_sum(m, s, shared[w], shared[kRowWarps + w]);
    sum += shared[2 * kRowWarps + w];
  }
}

template <typename scalar_t>
__global__ void rows_kernel(int64_t rows, int64_t vocab, const scalar_t* logits, scalar_t* grad,
                            const int64_t* __restrict__ target,
                            const at::opmath_type<scalar_t>* __restrict__ row_weight,
                            const at::opmath_type<scalar_t>* __restrict__ weight,
                            const at::opmath_type<scalar_t>* __restrict__ weight_sum_ptr,
                            const at::opmath_type<scalar_t>* __restrict__ grad_scale,
                            int64_t scale_stride, at::opmath_type<scalar_t>* loss,
                            at::opmath_type<scalar_t>* lse_data, bool want_loss,
                            int64_t ignore_index, at::opmath_type<scalar_t> smoothing,
                            at::opmath_type<scalar_t> z_loss, at::opmath_type<scalar_t> cap,
                            bool softcap) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t shared[3 * kRowWarps];
  const acc_t inv_cap = acc_t(1) / cap;
  const acc_t weight_sum = weight != nullptr ? *weight_sum_ptr : static_cast<acc_t>(vocab);
  const acc_t per_class = smoothing / static_cast<acc_t>(vocab);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    // `grad` may alias `logits` (hence no __restrict__ on either): every
    // read of the row happens before the block's first write to it (a
    // __syncthreads() separates them).
    const scalar_t* x = logits + row * vocab;
    const int64_t t = target[row];
    if (t == ignore_index) {
      if (want_loss && threadIdx.x == 0) {
        loss[row] = 0;
        lse_data[row] = 0;
      }
      if (grad != nullptr) {
        for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
          grad[row * vocab + c] = scalar_t(0);
        }
      }
      continue;
    }
    const acc_t w_t = row_weight[row];
    const acc_t z_t = capped(static_cast<acc_t>(x[t]), cap, inv_cap, softcap);
    acc_t lse;
    if (want_loss) {
      // The lowest finite value, so that -Inf logits add exp(-Inf) = 0.
      acc_t m = sizeof(acc_t) == 4 ? acc_t(-3.402823466e38f) : acc_t(-1.7976931348623157e308);
      acc_t s = 0;
      acc_t zsum = 0;
      for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
        const acc_t z = capped(static_cast<acc_t>(x[c]), cap, inv_cap, softcap);
        if (z > m) {
          s = s * ::exp(m - z) + acc_t(1);
          m = z;
        } else {
          s += ::exp(z - m);
        }
        zsum += weight != nullptr ? weight[c] * z : z;
      }
      block_reduce(m, s, zsum, shared);
      lse = m + ::log(s);
      if (threadIdx.x == 0) {
        acc_t value = (acc_t(1) - smoothing) * w_t * (lse - z_t) + z_loss * lse * lse;
        if (smoothing > 0) {
          value += per_class * (weight_sum * lse - zsum);
        }
        loss[row] = value;
        lse_data[row] = lse;
      }
    } else {
      lse = lse_data[row];
    }
    if (grad == nullptr) {
      continue;
    }
    __syncthreads();  // every thread has read x[t] and the row
    const acc_t scale = grad_scale[row * scale_stride];
    const acc_t a = (acc_t(1) - smoothing) * w_t + per_class * weight_sum + acc_t(2) * z_loss * lse;
    for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
      const acc_t z = capped(static_cast<acc_t>(x[c]), cap, inv_cap, softcap);
      const acc_t b = weight != nullptr ? per_class * weight[c] : per_class;
      acc_t g = ::exp(z - lse) * a - b;
      if (softcap) {
        const acc_t u = z * inv_cap;
        g *= acc_t(1) - u * u;
      }
      grad[row * vocab + c] = static_cast<scalar_t>(g * scale);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const acc_t b_t = weight != nullptr ? per_class * weight[t] : per_class;
      acc_t g = ::exp(z_t - lse) * a - b_t - (acc_t(1) - smoothing) * w_t;
      if (softcap) {
        const acc_t u = z_t * inv_cap;
        g *= acc_t(1) - u * u;
      }
      grad[row * vocab + t] = static_cast<scalar_t>(g * scale);
    }
  }
}

void target_cuda_kernel(const detail::CrossEntropyTargetArgs& args) {
  c10::cuda::CUDAGuard device_guard(args.target.device());
  const int64_t rows = args.target.numel();
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(args.row_weight.scalar_type(), "fuseops::cross_entropy", [&] {
    target_kernel<scalar_t><<<blocks_for(rows), kThreadsPerBlock, 0, stream>>>(
        rows, args.target.const_data_ptr<int64_t>(),
        args.weight.defined() ? args.weight.const_data_ptr<scalar_t>() : nullptr,
        args.row_weight.mutable_data_ptr<scalar_t>(), args.vocab, args.ignore_index);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void rows_cuda_kernel(const detail::CrossEntropyRowsArgs& args) {
  c10::cuda::CUDAGuard device_guard(args.logits.device());
  const int64_t rows = args.logits.size(0);
  const int64_t vocab = args.logits.size(1);
  auto stream = c10::cuda::getCurrentCUDAStream();
  const int blocks = static_cast<int>(std::min<int64_t>(rows, 65535));
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, args.logits.scalar_type(), "fuseops::cross_entropy", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const bool want_loss = args.loss.defined();
        rows_kernel<scalar_t><<<blocks, kRowThreads, 0, stream>>>(
            rows, vocab, args.logits.const_data_ptr<scalar_t>(),
            args.grad.defined() ? args.grad.mutable_data_ptr<scalar_t>() : nullptr,
            args.target.const_data_ptr<int64_t>(), args.row_weight.const_data_ptr<acc_t>(),
            args.weight.defined() ? args.weight.const_data_ptr<acc_t>() : nullptr,
            args.weight.defined() ? args.weight_sum.const_data_ptr<acc_t>() : nullptr,
            args.grad_scale.defined() ? args.grad_scale.const_data_ptr<acc_t>() : nullptr,
            args.grad_scale.defined() && args.grad_scale.dim() > 0 ? 1 : 0,
            want_loss ? args.loss.mutable_data_ptr<acc_t>() : nullptr,
            want_loss ? args.lse.mutable_data_ptr<acc_t>()
                      : const_cast<acc_t*>(args.lse.const_data_ptr<acc_t>()),
            want_loss, args.options.ignore_index, static_cast<acc_t>(args.options.label_smoothing),
            static_cast<acc_t>(args.options.z_loss),
            args.options.softcap > 0 ? static_cast<acc_t>(args.options.softcap) : acc_t(1),
            args.options.softcap > 0);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(CrossEntropyCudaKernels::target, &target_cuda_kernel);
FUSEOPS_REGISTER_KERNEL(CrossEntropyCudaKernels::rows, &rows_cuda_kernel);

}  // namespace fuseops::cuda
