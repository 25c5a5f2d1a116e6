// causal_conv1d CUDA kernels and their registration; checks, layout and
// allocation are shared with the CPU and Meta backends
// (cpp/ops/causal_conv1d.cpp).
//
// Every tensor is read through its strides. Threads are numbered so that
// neighbours touch neighbouring memory: along time for the rows layout,
// along channels for the channel-last layout. The width inputs of an output
// are re-read by its neighbours from L1/L2, so memory sees each input about
// once.
// Forward: one thread per output. Backward: one thread per element of
// initial_states ++ x, which recomputes the W values of g = grad_out *
// act'(pre) its gradient needs (no temporary tensor); grad_weight/grad_bias:
// a fixed grid of blocks, each summing a fixed set of (batch, time) rows for
// its channels and reducing them in shared memory in a fixed tree, then a
// second kernel adds the blocks' partials in order: deterministic, no
// atomics. Update: one thread per (batch, channel).

#include <cstdint>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "activation_math.cuh"
#include "elementwise.cuh"
#include "ops/causal_conv1d.h"
#include "ops_generated/cuda/causal_conv1d.h"
#include "ops/causal_conv1d_dispatch.h"

namespace fuseops::cuda {
namespace {

using detail::ConvLayout;
using detail::dispatch_width_silu;

struct Strides {
  int64_t b, c, t;

  explicit Strides(const at::Tensor& t3)
      : b(t3.defined() ? t3.stride(0) : 0),
        c(t3.defined() ? t3.stride(1) : 0),
        t(t3.defined() ? t3.stride(2) : 0) {}

  __device__ __forceinline__ int64_t at(int64_t bi, int64_t ci, int64_t ti) const {
    return bi * b + ci * c + ti * t;
  }
};

struct Shape {
  int64_t batch, dim, seqlen;
};

// (b, c, t) of flat index `i` over (batch, dim, extent): channels fastest
// for channel-last, time fastest otherwise.
__device__ __forceinline__ void unflatten(int64_t i, int64_t dim, int64_t extent, bool channel_last,
                                          int64_t& b, int64_t& c, int64_t& t) {
  if (channel_last) {
    c = i % dim;
    t = (i / dim) % extent;
    b = i / (dim * extent);
  } else {
    t = i % extent;
    c = (i / extent) % dim;
    b = i / (extent * dim);
  }
}

template <bool kSilu, typename acc_t>
__device__ __forceinline__ acc_t activate(acc_t pre) {
  if constexpr (kSilu) {
    return activation_value<Activation::Silu>(pre);
  } else {
    return pre;
  }
}

// Element s of initial_states ++ x for s in [-(W-1), seqlen), as s - (W-1).
template <typename T, int W>
struct Input {
  const T* x;
  Strides xs;
  const T* states;  // nullptr: zeros
  Strides ss;

  __device__ __forceinline__ at::opmath_type<T> operator()(int64_t b, int64_t c, int64_t t) const {
    using acc_t = at::opmath_type<T>;
    if (t >= 0) {
      return static_cast<acc_t>(x[xs.at(b, c, t)]);
    }
    return states != nullptr ? static_cast<acc_t>(states[ss.at(b, c, t + W - 1)]) : acc_t(0);
  }
};

template <typename T, int W>
__device__ __forceinline__ at::opmath_type<T> pre_activation(const Input<T, W>& in,
                                                             const at::opmath_type<T>* w,
                                                             const at::opmath_type<T>* bias,
                                                             int64_t b, int64_t c, int64_t t) {
  using acc_t = at::opmath_type<T>;
  acc_t acc = bias != nullptr ? bias[c] : acc_t(0);
#pragma unroll
  for (int k = 0; k < W; ++k) {
    acc += w[c * W + k] * in(b, c, t - (W - 1) + k);
  }
  return acc;
}

// g[t] = grad_out[t] * act'(pre[t]) inside the sequence, 0 outside it.
template <typename T, int W, bool kSilu>
__device__ __forceinline__ at::opmath_type<T> output_grad(const Input<T, W>& in, const T* grad_out,
                                                          const Strides& gs,
                                                          const at::opmath_type<T>* w,
                                                          const at::opmath_type<T>* bias, int64_t b,
                                                          int64_t c, int64_t t, int64_t seqlen) {
  using acc_t = at::opmath_type<T>;
  if (t < 0 || t >= seqlen) {
    return acc_t(0);
  }
  const acc_t dy = static_cast<acc_t>(grad_out[gs.at(b, c, t)]);
  if constexpr (kSilu) {
    return dy * activation_derivative<Activation::Silu>(pre_activation(in, w, bias, b, c, t),
                                                        static_cast<acc_t*>(nullptr));
  } else {
    return dy;
  }
}

template <typename T, int W, bool kSilu>
__global__ void forward_kernel(T* out, Strides os, Input<T, W> in, const at::opmath_type<T>* w,
                               const at::opmath_type<T>* bias, Shape shape, bool channel_last) {
  const int64_t n = shape.batch * shape.dim * shape.seqlen;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t b, c, t;
    unflatten(i, shape.dim, shape.seqlen, channel_last, b, c, t);
    out[os.at(b, c, t)] = static_cast<T>(activate<kSilu>(pre_activation(in, w, bias, b, c, t)));
  }
}

// Position p of initial_states ++ x (p < W-1: the states; x's time
// s = p - (W-1)) is read with weight k by output p - k:
//   grad[p] = sum_k w[k] g[p - k] + grad_final[p - seqlen].
template <typename T, int W, bool kSilu>
__global__ void backward_input_kernel(T* grad_x, Strides dxs, T* grad_states, Strides dss,
                                      const T* grad_out, Strides gs, const T* grad_final,
                                      Strides fs, Input<T, W> in, const at::opmath_type<T>* w,
                                      const at::opmath_type<T>* bias, Shape shape,
                                      bool channel_last) {
  using acc_t = at::opmath_type<T>;
  const int64_t extent = shape.seqlen + W - 1;
  const int64_t n = shape.batch * shape.dim * extent;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t b, c, p;
    unflatten(i, shape.dim, extent, channel_last, b, c, p);
    const int64_t s = p - (W - 1);
    acc_t sum = 0;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      sum += w[c * W + k] * output_grad<T, W, kSilu>(in, grad_out, gs, w, bias, b, c,
                                                     s + (W - 1) - k, shape.seqlen);
    }
    if (grad_final != nullptr && s >= shape.seqlen - (W - 1)) {
      sum += static_cast<acc_t>(grad_final[fs.at(b, c, s - (shape.seqlen - (W - 1)))]);
    }
    if (s >= 0) {
      grad_x[dxs.at(b, c, s)] = static_cast<T>(sum);
    } else {
      grad_states[dss.at(b, c, p)] = static_cast<T>(sum);
    }
  }
}

constexpr int kWeightParts = 32;

// Block (blockIdx.x, part): channels c = blockIdx.x * blockDim.x +
// threadIdx.x, rows n = (batch, time) with n = part * blockDim.y +
// threadIdx.y + k * kWeightParts * blockDim.y. partials: (parts, W + 1, dim).
template <typename T, int W, bool kSilu>
__global__ void weight_partials_kernel(at::opmath_type<T>* partials, const T* grad_out, Strides gs,
                                       Input<T, W> in, const at::opmath_type<T>* w,
                                       const at::opmath_type<T>* bias, Shape shape) {
  using acc_t = at::opmath_type<T>;
  extern __shared__ unsigned char shared_bytes[];
  acc_t* shared = reinterpret_cast<acc_t*>(shared_bytes);
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const bool active = c < shape.dim;
  acc_t sums[W + 1];
#pragma unroll
  for (int q = 0; q <= W; ++q) {
    sums[q] = 0;
  }
  if (active) {
    const int64_t rows = shape.batch * shape.seqlen;
    for (int64_t n = blockIdx.y * static_cast<int64_t>(blockDim.y) + threadIdx.y; n < rows;
         n += static_cast<int64_t>(gridDim.y) * blockDim.y) {
      const int64_t b = n / shape.seqlen;
      const int64_t t = n % shape.seqlen;
      const acc_t g = output_grad<T, W, kSilu>(in, grad_out, gs, w, bias, b, c, t, shape.seqlen);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        sums[k] += g * in(b, c, t - (W - 1) + k);
      }
      sums[W] += g;
    }
  }
  const int lanes = blockDim.x;
  const int slot = threadIdx.y * lanes + threadIdx.x;
  const int slots = blockDim.y * lanes;
#pragma unroll
  for (int q = 0; q <= W; ++q) {
    shared[q * slots + slot] = sums[q];
  }
  __syncthreads();
  for (int half = blockDim.y / 2; half > 0; half /= 2) {
    if (threadIdx.y < half) {
#pragma unroll
      for (int q = 0; q <= W; ++q) {
        shared[q * slots + slot] += shared[q * slots + slot + half * lanes];
      }
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && active) {
#pragma unroll
    for (int q = 0; q <= W; ++q) {
      partials[(blockIdx.y * (W + 1) + q) * shape.dim + c] = shared[q * slots + threadIdx.x];
    }
  }
}

template <typename acc_t>
__global__ void sum_weight_partials_kernel(acc_t* grad_weight, acc_t* grad_bias,
                                           const acc_t* partials, int parts, int64_t dim,
                                           int width) {
  const int64_t n = dim * (width + 1);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % dim;
    const int64_t q = i / dim;
    acc_t sum = 0;
    for (int part = 0; part < parts; ++part) {
      sum += partials[(part * (width + 1) + q) * dim + c];
    }
    if (q < width) {
      grad_weight[c * width + q] = sum;
    } else {
      grad_bias[c] = sum;
    }
  }
}

// The CPU's update row loop again; not shared: a host/device version would
// need accessors for the strided rows and each device's SiLU, as many lines
// as it would save.
template <typename T>
__global__ void update_kernel(T* out, const T* x, Strides xs, T* state, Strides ss,
                              const at::opmath_type<T>* w, const at::opmath_type<T>* bias,
                              Shape shape, int64_t state_len, int width, bool silu) {
  using acc_t = at::opmath_type<T>;
  const int64_t rows = shape.batch * shape.dim;
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; row < rows;
       row += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = row / shape.dim;
    const int64_t c = row % shape.dim;
    auto joined = [&](int64_t i) {
      return i < state_len ? state[ss.at(b, c, i)] : x[xs.at(b, c, i - state_len)];
    };
    for (int64_t t = 0; t < shape.seqlen; ++t) {
      acc_t acc = bias != nullptr ? bias[c] : acc_t(0);
      for (int k = 0; k < width; ++k) {
        acc += w[c * width + k] * static_cast<acc_t>(joined(state_len + t - (width - 1) + k));
      }
      if (silu) {
        acc = activation_value<Activation::Silu>(acc);
      }
      out[row * shape.seqlen + t] = static_cast<T>(acc);
    }
    // Element j of the new state is element seqlen + j of the joined
    // sequence, read before this loop overwrites it.
    for (int64_t j = 0; j < state_len; ++j) {
      state[ss.at(b, c, j)] = joined(shape.seqlen + j);
    }
  }
}

template <typename T>
const T* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr<T>() : nullptr;
}

void causal_conv1d_kernel(const at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                          const at::Tensor& bias, const at::Tensor& states, bool silu,
                          ConvLayout layout) {
  c10::cuda::CUDAGuard device_guard(x.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, x.scalar_type(), "fuseops::causal_conv1d", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const Shape shape{x.size(0), x.size(1), x.size(2)};
        auto stream = c10::cuda::getCurrentCUDAStream();
        dispatch_width_silu(weight.size(1), silu, [&](auto width, auto with_silu) {
          constexpr int W = decltype(width)::value;
          const Input<scalar_t, W> in{x.const_data_ptr<scalar_t>(), Strides(x),
                                      data_or_null<scalar_t>(states), Strides(states)};
          forward_kernel<scalar_t, W, decltype(with_silu)::value>
              <<<blocks_for(out.numel()), kThreadsPerBlock, 0, stream>>>(
                  out.mutable_data_ptr<scalar_t>(), Strides(out), in,
                  weight.const_data_ptr<acc_t>(), data_or_null<acc_t>(bias), shape,
                  layout == ConvLayout::kChannelLast);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
      });
}

void causal_conv1d_backward_kernel(const at::Tensor& grad_x, const at::Tensor& grad_weight,
                                   const at::Tensor& grad_bias, const at::Tensor& grad_states,
                                   const at::Tensor& grad_output, const at::Tensor& x,
                                   const at::Tensor& weight, const at::Tensor& bias,
                                   const at::Tensor& states, const at::Tensor& grad_final,
                                   bool silu, ConvLayout layout) {
  c10::cuda::CUDAGuard device_guard(x.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, x.scalar_type(), "fuseops::causal_conv1d_backward", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const Shape shape{x.size(0), x.size(1), x.size(2)};
        const bool channel_last = layout == ConvLayout::kChannelLast;
        auto stream = c10::cuda::getCurrentCUDAStream();
        const int64_t width_value = weight.size(1);
        at::Tensor partials =
            at::empty({kWeightParts, width_value + 1, shape.dim}, grad_weight.options());
        dispatch_width_silu(width_value, silu, [&](auto width, auto with_silu) {
          constexpr int W = decltype(width)::value;
          constexpr bool kSilu = decltype(with_silu)::value;
          const Input<scalar_t, W> in{x.const_data_ptr<scalar_t>(), Strides(x),
                                      data_or_null<scalar_t>(states), Strides(states)};
          const acc_t* w = weight.const_data_ptr<acc_t>();
          const acc_t* b = data_or_null<acc_t>(bias);
          const scalar_t* dy = grad_output.const_data_ptr<scalar_t>();
          backward_input_kernel<scalar_t, W, kSilu>
              <<<blocks_for(shape.batch * shape.dim * (shape.seqlen + W - 1)), kThreadsPerBlock, 0,
                 stream>>>(grad_x.mutable_data_ptr<scalar_t>(), Strides(grad_x),
                           grad_states.mutable_data_ptr<scalar_t>(), Strides(grad_states), dy,
                           Strides(grad_output), data_or_null<scalar_t>(grad_final),
                           Strides(grad_final), in, w, b, shape, channel_last);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
          // Channel-last: 32 neighbouring channels by 8 rows; rows layout:
          // one channel by 256 rows, neighbours in time.
          const dim3 threads = channel_last ? dim3(32, 8) : dim3(1, 256);
          const dim3 grid(static_cast<unsigned>((shape.dim + threads.x - 1) / threads.x),
                          kWeightParts);
          const size_t shared = (W + 1) * threads.x * threads.y * sizeof(acc_t);
          weight_partials_kernel<scalar_t, W, kSilu><<<grid, threads, shared, stream>>>(
              partials.mutable_data_ptr<acc_t>(), dy, Strides(grad_output), in, w, b, shape);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
        sum_weight_partials_kernel<acc_t>
            <<<blocks_for(shape.dim * (width_value + 1)), kThreadsPerBlock, 0, stream>>>(
                grad_weight.mutable_data_ptr<acc_t>(), grad_bias.mutable_data_ptr<acc_t>(),
                partials.const_data_ptr<acc_t>(), kWeightParts, shape.dim,
                static_cast<int>(width_value));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

void causal_conv1d_update_kernel(const at::Tensor& out, const at::Tensor& x,
                                 const at::Tensor& conv_state, const at::Tensor& weight,
                                 const at::Tensor& bias, bool silu) {
  c10::cuda::CUDAGuard device_guard(x.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, x.scalar_type(), "fuseops::causal_conv1d_update", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const Shape shape{x.size(0), x.size(1), x.size(2)};
        update_kernel<scalar_t><<<blocks_for(shape.batch * shape.dim), kThreadsPerBlock, 0,
                                  c10::cuda::getCurrentCUDAStream()>>>(
            out.mutable_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), Strides(x),
            conv_state.mutable_data_ptr<scalar_t>(), Strides(conv_state),
            weight.const_data_ptr<acc_t>(), data_or_null<acc_t>(bias), shape, conv_state.size(2),
            static_cast<int>(weight.size(1)), silu);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(CausalConv1dCudaKernels::forward, &causal_conv1d_kernel);
FUSEOPS_REGISTER_KERNEL(CausalConv1dCudaKernels::backward, &causal_conv1d_backward_kernel);
FUSEOPS_REGISTER_KERNEL(CausalConv1dCudaKernels::update, &causal_conv1d_update_kernel);

}  // namespace fuseops::cuda
