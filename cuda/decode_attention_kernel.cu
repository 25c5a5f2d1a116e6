// decode_attention CUDA kernel and its registration; checks and allocation
// are shared with the CPU and Meta backends (cpp/ops/decode_attention.cpp).
//
// State: a simple, correct kernel, not a tuned one (no split of the keys
// across blocks, no shared K/V tiles between the heads of a group). One
// block of 128 threads per output row (batch, query head, position): the
// threads compute the row's scores into a float32 scratch row in global
// memory (softcap, mask and causal limit applied as on the CPU), reduce the
// max, write the exponentials and reduce their sum, then each thread sums
// p * value over the keys for its output features. The rules for rows that
// see no key (zeros) and for -inf/NaN scores are the CPU kernel's.

#include <cmath>
#include <cstdint>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <torch/library.h>

#include <ATen/ops/empty.h>

#include "ops/decode_attention.h"
#include "ops_generated/cuda/decode_attention.h"

namespace fuseops::cuda {
namespace {

constexpr int kThreads = 128;

struct Strides4 {
  int64_t s0, s1, s2, s3;
};

Strides4 strides_of(const at::Tensor& t) {
  return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

template <typename acc_t>
__device__ acc_t max_nan(acc_t a, acc_t b) {
  return (a > b || isnan(a)) ? a : b;
}

template <typename scalar_t, typename acc_t>
__global__ void decode_attention_cuda(scalar_t* __restrict__ out, const scalar_t* query,
                                      Strides4 qs, const scalar_t* key, Strides4 ks,
                                      const scalar_t* value, Strides4 vs, const bool* mask_bool,
                                      const float* mask_float, Strides4 ms, acc_t* scores,
                                      uint8_t* seen, int64_t q_heads, int64_t q_len, int64_t dim,
                                      int64_t group, int64_t keys, int64_t v_dim, bool is_causal,
                                      acc_t scale, acc_t softcap) {
  __shared__ acc_t reduce[kThreads];
  __shared__ int any_shared[kThreads];
  const int64_t row = blockIdx.x;
  const int64_t i = row % q_len;
  const int64_t h = (row / q_len) % q_heads;
  const int64_t b = row / (q_len * q_heads);
  const int64_t kv = h / group;
  const acc_t neg_inf = -INFINITY;
  const scalar_t* q = query + b * qs.s0 + h * qs.s1 + i * qs.s2;
  acc_t* row_scores = scores + row * keys;
  uint8_t* row_seen = seen + row * keys;
  const int64_t limit = is_causal ? keys - q_len + i : keys - 1;

  acc_t m = neg_inf;
  int any = 0;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
    const scalar_t* k = key + b * ks.s0 + kv * ks.s1 + j * ks.s2;
    acc_t s = 0;
    for (int64_t d = 0; d < dim; ++d) {
      s += static_cast<acc_t>(q[d]) * scale * static_cast<acc_t>(k[d]);
    }
    if (softcap > 0) {
      s = softcap * tanh(s / softcap);
    }
    bool visible = j <= limit;
    if (visible && (mask_bool != nullptr || mask_float != nullptr)) {
      const int64_t offset = b * ms.s0 + h * ms.s1 + i * ms.s2 + j * ms.s3;
      if (mask_bool != nullptr) {
        visible = mask_bool[offset];
      } else {
        const float bias = mask_float[offset];
        visible = bias != -INFINITY;
        s += static_cast<acc_t>(bias);
      }
    }
    row_seen[j] = visible;
    row_scores[j] = s;
    if (visible) {
      any = 1;
      m = max_nan(m, s);
    }
  }
  reduce[threadIdx.x] = m;
  any_shared[threadIdx.x] = any;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      reduce[threadIdx.x] = max_nan(reduce[threadIdx.x], reduce[threadIdx.x + stride]);
      any_shared[threadIdx.x] |= any_shared[threadIdx.x + stride];
    }
    __syncthreads();
  }
  m = reduce[0];
  any = any_shared[0];
  __syncthreads();

  scalar_t* o = out + row * v_dim;
  if (!any || m == neg_inf) {
    // No key seen: zeros; seen keys all at -inf: NaN, as softmax gives.
    const acc_t fill = any ? static_cast<acc_t>(NAN) : acc_t(0);
    for (int64_t d = threadIdx.x; d < v_dim; d += blockDim.x) {
      o[d] = static_cast<scalar_t>(fill);
    }
    return;
  }
  acc_t sum = 0;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
    const acc_t p = row_seen[j] ? exp(row_scores[j] - m) : acc_t(0);
    row_scores[j] = p;
    sum += p;
  }
  reduce[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      reduce[threadIdx.x] += reduce[threadIdx.x + stride];
    }
    __syncthreads();
  }
  sum = reduce[0];
  for (int64_t d = threadIdx.x; d < v_dim; d += blockDim.x) {
    acc_t acc = 0;
    for (int64_t j = 0; j < keys; ++j) {
      if (row_seen[j]) {
        acc += row_scores[j] * static_cast<acc_t>(value[b * vs.s0 + kv * vs.s1 + j * vs.s2 + d]);
      }
    }
    o[d] = static_cast<scalar_t>(acc / sum);
  }
}

void decode_attention_kernel(const at::Tensor& out, const at::Tensor& query, const at::Tensor& key,
                             const at::Tensor& value, const at::Tensor& mask, bool is_causal,
                             double scale, double softcap) {
  c10::cuda::CUDAGuard device_guard(query.device());
  const int64_t rows = query.size(0) * query.size(1) * query.size(2);
  const int64_t keys = key.size(2);
  const bool bool_mask = mask.defined() && mask.scalar_type() == at::kBool;
  const bool float_mask = mask.defined() && !bool_mask;
  const Strides4 ms = mask.defined() ? strides_of(mask) : Strides4{0, 0, 0, 0};
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor seen = at::empty({rows, keys}, query.options().dtype(at::kByte));
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, query.scalar_type(), "fuseops::decode_attention", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const at::Tensor scores =
            at::empty({rows, keys}, query.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
        decode_attention_cuda<scalar_t, acc_t><<<rows, kThreads, 0, stream>>>(
            out.mutable_data_ptr<scalar_t>(), query.const_data_ptr<scalar_t>(), strides_of(query),
            key.const_data_ptr<scalar_t>(), strides_of(key), value.const_data_ptr<scalar_t>(),
            strides_of(value), bool_mask ? mask.const_data_ptr<bool>() : nullptr,
            float_mask ? mask.const_data_ptr<float>() : nullptr, ms,
            scores.mutable_data_ptr<acc_t>(), seen.mutable_data_ptr<uint8_t>(), query.size(1),
            query.size(2), query.size(3), query.size(1) / key.size(1), keys, value.size(3),
            is_causal, static_cast<acc_t>(scale), static_cast<acc_t>(softcap));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(DecodeAttentionCudaKernels::forward, &decode_attention_kernel);

}  // namespace fuseops::cuda
