// jsd CUDA kernels and their registration; checks and allocation are shared
// with the CPU and Meta backends (cpp/ops/jsd.cpp).
//
// One block per row (grid-stride over rows). The forward's first pass keeps,
// per thread, a running maximum and sum of exp(z - max) (online softmax) of
// the student's and of the teacher's scaled row, merged across the warp with
// shuffles and across warps through shared memory; a second pass sums the
// divergence terms (a block sum). The backward reads the saved statistics
// and writes each gradient element once. Arithmetic is float32 (float64 for
// double); the semantics are the CPU kernel's (ops/jsd.h).

#include <algorithm>
#include <cmath>
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
#include "ops/jsd.h"
#include "ops_generated/cuda/jsd.h"

namespace fuseops::cuda {
namespace {

using detail::JsdMode;

constexpr int kRowThreads = 256;
constexpr int kRowWarps = kRowThreads / kWarpSize;

// Two (m, s) pairs merged over the whole block, returned to every thread.
template <typename acc_t>
__device__ void block_max_sum(acc_t& m1, acc_t& s1, acc_t& m2, acc_t& s2, acc_t* shared) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    merge_max_sum(m1, s1, __shfl_xor_sync(0xffffffffu, m1, offset),
                  __shfl_xor_sync(0xffffffffu, s1, offset));
    merge_max_sum(m2, s2, __shfl_xor_sync(0xffffffffu, m2, offset),
                  __shfl_xor_sync(0xffffffffu, s2, offset));
  }
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  __syncthreads();  // the previous readers are done with `shared`
  if (lane == 0) {
    shared[warp] = m1;
    shared[kRowWarps + warp] = s1;
    shared[2 * kRowWarps + warp] = m2;
    shared[3 * kRowWarps + warp] = s2;
  }
  __syncthreads();
  m1 = shared[0];
  s1 = shared[kRowWarps];
  m2 = shared[2 * kRowWarps];
  s2 = shared[3 * kRowWarps];
  for (int w = 1; w < kRowWarps; ++w) {
    merge_max_sum(m1, s1, shared[w], shared[kRowWarps + w]);
    merge_max_sum(m2, s2, shared[2 * kRowWarps + w], shared[3 * kRowWarps + w]);
  }
}

// Three sums over the whole block, returned to every thread.
template <typename acc_t>
__device__ void block_sum3(acc_t& a, acc_t& b, acc_t& c, acc_t* shared) {
  a = warp_sum(a);
  b = warp_sum(b);
  c = warp_sum(c);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  __syncthreads();
  if (lane == 0) {
    shared[warp] = a;
    shared[kRowWarps + warp] = b;
    shared[2 * kRowWarps + warp] = c;
  }
  __syncthreads();
  a = 0;
  b = 0;
  c = 0;
  for (int w = 0; w < kRowWarps; ++w) {
    a += shared[w];
    b += shared[kRowWarps + w];
    c += shared[2 * kRowWarps + w];
  }
}

// x * inv_t rounded, never fused with the subtraction that follows (nvcc
// contracts by default): every pass scales as the logsumexp pass did, so the
// row's maximum gives exactly log p = -log(sum) (see the CPU kernel).
__device__ __forceinline__ float scaled(float x, float inv_t) { return __fmul_rn(x, inv_t); }
__device__ __forceinline__ double scaled(double x, double inv_t) { return __dmul_rn(x, inv_t); }

// prob * diff, 0 where prob is 0 (the limit of p log p).
template <typename acc_t>
__device__ __forceinline__ acc_t weighted(acc_t prob, acc_t diff) {
  return prob == acc_t(0) ? acc_t(0) : prob * diff;
}

// logaddexp(a, c).
template <typename acc_t>
__device__ __forceinline__ acc_t log_mixture(acc_t a, acc_t c) {
  const acc_t hi = a > c || a != a ? a : c;
  return hi + ::log1p(::exp(-::fabs(a - c)));
}

template <typename scalar_t, JsdMode kMode>
__global__ void rows_kernel(int64_t rows, int64_t vocab, const scalar_t* __restrict__ student,
                            const scalar_t* __restrict__ teacher, scalar_t* __restrict__ grad,
                            const int64_t* __restrict__ label, int64_t ignore_index,
                            const at::opmath_type<scalar_t>* __restrict__ grad_scale,
                            int64_t scale_stride, at::opmath_type<scalar_t>* __restrict__ loss,
                            at::opmath_type<scalar_t>* __restrict__ row_stats,
                            at::opmath_type<scalar_t> inv_t, at::opmath_type<scalar_t> beta,
                            at::opmath_type<scalar_t> log_beta,
                            at::opmath_type<scalar_t> log_1m_beta,
                            at::opmath_type<scalar_t> grad_factor) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t shared[4 * kRowWarps];
  const bool want_loss = loss != nullptr;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const scalar_t* x = student + row * vocab;
    const scalar_t* y = teacher + row * vocab;
    if (label != nullptr && label[row] == ignore_index) {
      if (want_loss && threadIdx.x == 0) {
        loss[row] = 0;
        row_stats[3 * row] = 0;
        row_stats[3 * row + 1] = 0;
        row_stats[3 * row + 2] = 0;
      }
      if (grad != nullptr) {
        for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
          grad[row * vocab + c] = scalar_t(0);
        }
      }
      continue;
    }
    acc_t lse_s;
    acc_t lse_t;
    acc_t ks;
    if (want_loss) {
      // The lowest finite value, so that -Inf logits add exp(-Inf) = 0.
      const acc_t lowest =
          sizeof(acc_t) == 4 ? acc_t(-3.402823466e38f) : acc_t(-1.7976931348623157e308);
      acc_t m_s = lowest;
      acc_t s_s = 0;
      acc_t m_t = lowest;
      acc_t s_t = 0;
      for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
        merge_max_sum(m_s, s_s, scaled(static_cast<acc_t>(x[c]), inv_t), acc_t(1));
        merge_max_sum(m_t, s_t, scaled(static_cast<acc_t>(y[c]), inv_t), acc_t(1));
      }
      block_max_sum(m_s, s_s, m_t, s_t, shared);
      lse_s = m_s + ::log(s_s);
      lse_t = m_t + ::log(s_t);
      acc_t k_s = 0;
      acc_t k_t = 0;
      acc_t z = 0;  // sum p, which K_s is normalized by (the CPU kernel's header)
      for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
        const acc_t s = scaled(static_cast<acc_t>(x[c]), inv_t) - lse_s;
        const acc_t t = scaled(static_cast<acc_t>(y[c]), inv_t) - lse_t;
        if constexpr (kMode == JsdMode::ForwardKl) {
          k_t += weighted(::exp(t), t - s);
        } else if constexpr (kMode == JsdMode::ReverseKl) {
          const acc_t p = ::exp(s);
          k_s += weighted(p, s - t);
          z += p;
        } else {
          const acc_t m = log_mixture(t + log_beta, s + log_1m_beta);
          const acc_t p = ::exp(s);
          k_s += weighted(p, s - m);
          z += p;
          k_t += weighted(::exp(t), t - m);
        }
      }
      block_sum3(k_s, k_t, z, shared);
      ks = z > acc_t(0) ? k_s / z : k_s;
      if (threadIdx.x == 0) {
        acc_t value;
        if constexpr (kMode == JsdMode::ForwardKl) {
          value = k_t;
        } else if constexpr (kMode == JsdMode::ReverseKl) {
          value = k_s;
        } else {
          value = beta * k_t + (acc_t(1) - beta) * k_s;
        }
        loss[row] = value;
        row_stats[3 * row] = lse_s;
        row_stats[3 * row + 1] = lse_t;
        row_stats[3 * row + 2] = ks;
      }
    } else {
      lse_s = row_stats[3 * row];
      lse_t = row_stats[3 * row + 1];
      ks = row_stats[3 * row + 2];
    }
    if (grad == nullptr) {
      continue;
    }
    const acc_t scale = grad_scale[row * scale_stride] * grad_factor;
    for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
      const acc_t s = scaled(static_cast<acc_t>(x[c]), inv_t) - lse_s;
      const acc_t t = scaled(static_cast<acc_t>(y[c]), inv_t) - lse_t;
      const acc_t p = ::exp(s);
      acc_t g;
      if constexpr (kMode == JsdMode::ForwardKl) {
        g = p - ::exp(t);
      } else if constexpr (kMode == JsdMode::ReverseKl) {
        g = weighted(p, s - t - ks);
      } else {
        g = weighted(p, s - log_mixture(t + log_beta, s + log_1m_beta) - ks);
      }
      grad[row * vocab + c] = static_cast<scalar_t>(g * scale);
    }
  }
}

template <typename scalar_t, JsdMode kMode>
void launch(const detail::JsdRowsArgs& args) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t rows = args.student.size(0);
  const int64_t vocab = args.student.size(1);
  const int blocks = static_cast<int>(std::min<int64_t>(rows, 65535));
  const double beta = args.options.beta;
  const double inv_t = 1.0 / args.options.temperature;
  const bool mixture = kMode == JsdMode::Mixture;
  const bool want_loss = args.loss.defined();
  rows_kernel<scalar_t, kMode><<<blocks, kRowThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      rows, vocab, args.student.const_data_ptr<scalar_t>(), args.teacher.const_data_ptr<scalar_t>(),
      args.grad.defined() ? args.grad.mutable_data_ptr<scalar_t>() : nullptr,
      args.label.defined() ? args.label.const_data_ptr<int64_t>() : nullptr,
      args.options.ignore_index,
      args.grad_scale.defined() ? args.grad_scale.const_data_ptr<acc_t>() : nullptr,
      args.grad_scale.defined() && args.grad_scale.dim() > 0 ? 1 : 0,
      want_loss ? args.loss.mutable_data_ptr<acc_t>() : nullptr,
      want_loss ? args.row_stats.mutable_data_ptr<acc_t>()
                : const_cast<acc_t*>(args.row_stats.const_data_ptr<acc_t>()),
      static_cast<acc_t>(inv_t), static_cast<acc_t>(beta),
      mixture ? static_cast<acc_t>(std::log(beta)) : acc_t(0),
      mixture ? static_cast<acc_t>(std::log1p(-beta)) : acc_t(0),
      static_cast<acc_t>(mixture ? inv_t * (1.0 - beta) : inv_t));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void rows_cuda_kernel(const detail::JsdRowsArgs& args) {
  c10::cuda::CUDAGuard device_guard(args.student.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, args.student.scalar_type(),
                                  "fuseops::jsd", [&] {
                                    switch (detail::jsd_mode(args.options.beta)) {
                                      case JsdMode::ForwardKl:
                                        launch<scalar_t, JsdMode::ForwardKl>(args);
                                        break;
                                      case JsdMode::ReverseKl:
                                        launch<scalar_t, JsdMode::ReverseKl>(args);
                                        break;
                                      case JsdMode::Mixture:
                                        launch<scalar_t, JsdMode::Mixture>(args);
                                        break;
                                    }
                                  });
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(JsdCudaKernels::rows, &rows_cuda_kernel);

}  // namespace fuseops::cuda
