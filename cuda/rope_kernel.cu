// rope CUDA kernel and its registration; checks and allocation are shared
// with the CPU and Meta backends (cpp/ops/rope.cpp).
//
// Blocks of 8 row groups x 32 lanes: each group takes one (token, head) row
// of query or key at a time (grid-stride over rows), its lanes the rotary
// pairs of that row (for rotate_half, lane j reads j and j + rotary_dim/2:
// consecutive lanes read consecutive addresses) and then the pass-through
// tail of a partial rotary. cos/sin are float32 (float64 for double) rows of
// the cache, read through the read-only cache; math is in that dtype.
//
// Positions are checked on the device: a position outside [0, max_pos)
// fails a device-side assertion (the next CUDA call reports "device-side
// assert triggered", as torch's own indexing does) and its row reads
// nothing from the cache (it would be written as NaN if assertions were
// compiled out): no out-of-bounds read, never a plausible wrong value.

#include <cstdint>
#include <limits>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/macros/Macros.h>
#include <torch/library.h>

#include "elementwise.cuh"
#include "ops/rope.h"
#include "ops_generated/cuda/rope.h"

namespace fuseops::cuda {
namespace {

constexpr int kLanes = 32;
constexpr int kRowGroups = 8;

template <typename scalar_t>
struct RowsView {
  scalar_t* out;
  const scalar_t* in;
  int64_t out_token, out_head, in_token, in_head;
  int64_t heads;
};

template <typename scalar_t>
struct RopeParams {
  RowsView<scalar_t> q, k;  // k.heads == 0 without key
  const at::opmath_type<scalar_t>* cos;
  const at::opmath_type<scalar_t>* sin;
  const int64_t* positions;  // nullptr: row t of cos/sin for token t
  int64_t table_rows;
  int64_t tokens, head_dim, rotary_dim;
};

template <typename scalar_t, bool kInterleaved, bool kTranspose>
__global__ void rope_cuda_kernel(RopeParams<scalar_t> p) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t heads = p.q.heads + p.k.heads;
  const int64_t rows = p.tokens * heads;
  const int64_t half = p.rotary_dim / 2;
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; row < rows;
       row += row_step) {
    const int64_t t = row / heads;
    const int64_t h = row % heads;
    const RowsView<scalar_t>& v = h < p.q.heads ? p.q : p.k;
    const int64_t head = h < p.q.heads ? h : h - p.q.heads;
    scalar_t* o = v.out + t * v.out_token + head * v.out_head;
    const scalar_t* x = v.in + t * v.in_token + head * v.in_head;
    const int64_t position = p.positions != nullptr ? p.positions[t] : t;
    const bool valid = position >= 0 && position < p.table_rows;
    CUDA_KERNEL_ASSERT(valid && "fuseops::rope: a position is outside the cos/sin cache");
    const opmath_t* c = p.cos + (valid ? position : 0) * p.rotary_dim;
    const opmath_t* s = p.sin + (valid ? position : 0) * p.rotary_dim;
    for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
      const int64_t i1 = kInterleaved ? 2 * j : j;
      const int64_t i2 = kInterleaved ? 2 * j + 1 : j + half;
      const opmath_t x1 = static_cast<opmath_t>(x[i1]);
      const opmath_t x2 = static_cast<opmath_t>(x[i2]);
      opmath_t o1 = std::numeric_limits<opmath_t>::quiet_NaN();
      opmath_t o2 = o1;
      if (valid) {
        const opmath_t c1 = __ldg(c + i1), c2 = __ldg(c + i2);
        const opmath_t s1 = __ldg(s + i1), s2 = __ldg(s + i2);
        if constexpr (kTranspose) {
          o1 = x1 * c1 + x2 * s2;
          o2 = x2 * c2 - x1 * s1;
        } else {
          o1 = x1 * c1 - x2 * s1;
          o2 = x2 * c2 + x1 * s2;
        }
      }
      o[i1] = static_cast<scalar_t>(o1);
      o[i2] = static_cast<scalar_t>(o2);
    }
    if (o != x) {
      for (int64_t e = p.rotary_dim + threadIdx.x; e < p.head_dim; e += blockDim.x) {
        o[e] = x[e];
      }
    }
  }
}

template <typename scalar_t>
RowsView<scalar_t> rows_view(const at::Tensor& out, const at::Tensor& in) {
  if (!in.defined()) {
    return RowsView<scalar_t>{nullptr, nullptr, 0, 0, 0, 0, 0};
  }
  return RowsView<scalar_t>{out.mutable_data_ptr<scalar_t>(),
                            in.const_data_ptr<scalar_t>(),
                            out.stride(0),
                            out.stride(1),
                            in.stride(0),
                            in.stride(1),
                            in.size(1)};
}

void rope_kernel(const detail::RopeKernelArgs& a) {
  c10::cuda::CUDAGuard device_guard(a.input.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, a.input.scalar_type(), "fuseops::rope", [&] {
        using opmath_t = at::opmath_type<scalar_t>;
        RopeParams<scalar_t> p{
            rows_view<scalar_t>(a.out, a.input),
            rows_view<scalar_t>(a.key_out, a.key),
            a.cos.const_data_ptr<opmath_t>(),
            a.sin.const_data_ptr<opmath_t>(),
            a.positions.defined() ? a.positions.const_data_ptr<int64_t>() : nullptr,
            a.cos.size(0),
            a.input.size(0),
            a.input.size(2),
            a.cos.size(1)};
        const int64_t rows = p.tokens * (p.q.heads + p.k.heads);
        if (rows == 0) {
          return;
        }
        const dim3 block(kLanes, kRowGroups);
        constexpr int64_t kMaxBlocks = 65535;
        const int64_t groups = (rows + kRowGroups - 1) / kRowGroups;
        const dim3 grid(static_cast<unsigned>(groups < kMaxBlocks ? groups : kMaxBlocks));
        auto stream = c10::cuda::getCurrentCUDAStream();
        if (a.interleaved) {
          a.transpose ? rope_cuda_kernel<scalar_t, true, true><<<grid, block, 0, stream>>>(p)
                      : rope_cuda_kernel<scalar_t, true, false><<<grid, block, 0, stream>>>(p);
        } else {
          a.transpose ? rope_cuda_kernel<scalar_t, false, true><<<grid, block, 0, stream>>>(p)
                      : rope_cuda_kernel<scalar_t, false, false><<<grid, block, 0, stream>>>(p);
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(RopeCudaKernels::rope, &rope_kernel);

}  // namespace fuseops::cuda
