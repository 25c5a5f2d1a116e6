// linear CPU kernel; compiled once per CPU capability
// (FuseopsCpuKernels.cmake).
//
// Decode shapes (at most kLinearStreamRows rows) are bound by reading the
// weight: each weight is used by a handful of rows only, so the time is the
// weight's bytes over the memory bandwidth. The kernel reads each weight
// row once: a task owns a block of kTaskChannels output channels and walks
// it in stripes of J weight rows, each stripe multiplied by every input row
// with J x rows float32 vector accumulators (one per row and channel, over
// vectors along K), the weight prefetched ahead of the loads. bfloat16 and
// float16 weights are widened to float32 in registers; the input rows are
// widened once per call and, when they exceed L1, walked in chunks of K that
// every stripe of the task reuses. On CPUs with AVX512_BF16 the AVX512
// build multiplies bfloat16 rows by vdpbf16ps instead: 32 weights and inputs
// a step in one instruction, read as they are (no widening at all).
//
// Each output is one accumulator's lanes summed over K in the same order,
// then reduced, whatever the number of rows or the thread count; builds
// differ only in the vector width (how K is split into lanes), and
// vdpbf16ps adds a lane's two products in the other order (and treats
// denormals as 0).
//
// ATen's matrix product (addmm/mm, what torch's linear calls) takes the rest:
// more rows, whose weights are reused enough for a blocked GEMM (or AMX) to
// win, and float64, which is for exactness; where ATen emulates bfloat16/
// float16, from kLinearWidenedRows rows its float32 product on widened
// operands (widened_products.h). Where ATen emulates bfloat16 or
// float16 products (reduced_gemms.h) the stream takes up to
// kLinearStreamRowsEmulated rows of them (8 rows of a 2048 x 2048 bfloat16
// product on an AVX-512 Xeon without AVX512_BF16: ATen 2.4 ms, 0.3 ms for 4
// rows here). One float32 row stays here
// although MKL's GEMV streams as fast: MKL splits its sums by the thread
// count (one unit in the last place apart between 1 and 2 threads), and a
// row's bits would differ between one row and two.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>

#include <fuseops/linear.h>

#include "ops/common/reduced_gemms.h"
#include "ops/common/widened_products.h"
#include "ops/linear.h"
#include "ops/cpu/elementwise.h"
#include "ops_generated/cpu/linear.h"
#include "ops/cpu/prefetch.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

using FloatVec = at::vec::Vectorized<float>;
constexpr int64_t kFloats = FloatVec::size();

// Output channels per parallel task: small enough that a projection of a
// few hundred channels still feeds many threads, a multiple of every J.
constexpr int64_t kTaskChannels = 16;

// Weight rows per stripe: J x rows accumulators within the vector
// registers (32 with AVX-512, 16 otherwise) beside J widened weight vectors
// and one input vector; one row (kSingleRowStripeRows: more weight rows in
// flight at once, which read 10-40% faster at M = 1 than the 2-4-row
// stripes on an AVX-512 and an AVX2 build), up to 4 rows (kStripeRows),
// and up to 8 (where ATen emulates bfloat16/float16 products,
// kWideStripeRows).
constexpr int kSingleRowStripeRows = per_build(8, 4, 4);
constexpr int kStripeRows = per_build(4, 2, 2);
constexpr int kWideStripeRows = per_build(2, 1, 1);
constexpr int kNarrowRows = static_cast<int>(kLinearStreamRows);
constexpr int kMaxRows = static_cast<int>(kLinearStreamRowsEmulated);

// The widened rows of a task's K chunk stay in L1 while every stripe of its
// channels runs over them: at most this many bytes of them.
constexpr int64_t kChunkBytes = 16 * 1024;

// The largest stripe whose next stripe is prefetched while it is read
// (task_chunk_with): far below L2's 1-2 MiB.
constexpr int64_t kNextStripeBytes = 64 * 1024;

// The weight's elements as float32 vectors, kSteps elements a step:
//  - float32: one vector;
//  - bfloat16 with AVX2/AVX-512: two vectors from one vector of bfloat16
//    pairs without any shuffle: the even elements shifted into place, the
//    odd ones masked, so the input rows are stored de-interleaved to match
//    (kPaired: each step's even elements, then its odd ones);
//  - float16 and the DEFAULT build: ATen's conversion, two vectors in order.
template <typename scalar_t>
struct Widen {
  static constexpr int kVectors = std::is_same_v<scalar_t, float> ? 1 : 2;
  static constexpr int64_t kSteps = kVectors * kFloats;
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  static constexpr bool kPaired = std::is_same_v<scalar_t, c10::BFloat16>;
#else
  static constexpr bool kPaired = false;
#endif

  static C10_ALWAYS_INLINE void load(const scalar_t* p, FloatVec* out) {
    if constexpr (kVectors == 1) {
      out[0] = FloatVec::loadu(p);
    } else if constexpr (kPaired) {
#if defined(CPU_CAPABILITY_AVX512)
      const __m512i pairs = _mm512_loadu_si512(p);
      out[0] = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
      out[1] = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(0xffff0000)));
#elif defined(CPU_CAPABILITY_AVX2)
      const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      out[0] = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
      out[1] = _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(0xffff0000)));
#endif
    } else {
      std::tie(out[0], out[1]) =
          at::vec::convert_to_float<scalar_t>(at::vec::Vectorized<scalar_t>::loadu(p));
    }
  }

  // Input row element i's place in the widened row (the layout load reads).
  static int64_t place(int64_t i, int64_t vectorized) {
    if (!kPaired || i >= vectorized) {
      return i;
    }
    const int64_t step = i - i % kSteps;
    const int64_t lane = i % kSteps;
    return step + (lane % 2) * kFloats + lane / 2;
  }
};

C10_ALWAYS_INLINE float sum_lanes(const FloatVec& v) {
  return at::vec::vec_reduce_all<float>([](FloatVec& a, FloatVec& b) { return a + b; }, v);
}

// acc[r * kTaskChannels + j] += sum over the steps of [begin, end) of
// x[r * k + i] * w[j * k + i], lane by lane, for R rows of the widened input
// and J rows of the weight.
template <int R, int J, typename scalar_t>
C10_ALWAYS_INLINE void dot_tile(const float* x, const scalar_t* w, int64_t k, int64_t begin,
                                int64_t end, int64_t ahead, FloatVec* acc_rows) {
  using Wv = Widen<scalar_t>;
  FloatVec acc[R][J];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < J; ++j) {
      acc[r][j] = acc_rows[r * kTaskChannels + j];
    }
  }
  for (int64_t i = begin; i < end; i += Wv::kSteps) {
    FloatVec wv[J][Wv::kVectors];
    for (int j = 0; j < J; ++j) {
      const scalar_t* row = w + j * k + i;
      prefetch_into_l2(row + ahead);
      Wv::load(row, wv[j]);
    }
    for (int h = 0; h < Wv::kVectors; ++h) {
      for (int r = 0; r < R; ++r) {
        const FloatVec xv = FloatVec::loadu(x + r * k + i + h * kFloats);
        for (int j = 0; j < J; ++j) {
          acc[r][j] = at::vec::fmadd(wv[j][h], xv, acc[r][j]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < J; ++j) {
      acc_rows[r * kTaskChannels + j] = acc[r][j];
    }
  }
}

#if defined(CPU_CAPABILITY_AVX512)
// dot_tile for bfloat16 rows and weights on CPUs with AVX512_BF16 (x: the
// input rows as they are): a step is 32 elements, lane i summing elements
// 2i and 2i + 1 of it, the lanes Widen's paired layout gives them.
template <int R, int J>
C10_ALWAYS_INLINE void dot_tile(const c10::BFloat16* x, const c10::BFloat16* w, int64_t k,
                                int64_t begin, int64_t end, int64_t ahead, FloatVec* acc_rows) {
  static_assert(Widen<c10::BFloat16>::kSteps == 32);
  __m512 acc[R][J];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < J; ++j) {
      acc[r][j] = acc_rows[r * kTaskChannels + j];
    }
  }
  for (int64_t i = begin; i < end; i += 32) {
    __m512i wv[J];
    for (int j = 0; j < J; ++j) {
      const c10::BFloat16* row = w + j * k + i;
      prefetch_into_l2(row + ahead);
      wv[j] = _mm512_loadu_si512(row);
    }
    for (int r = 0; r < R; ++r) {
      const __m512i xv = _mm512_loadu_si512(x + r * k + i);
      for (int j = 0; j < J; ++j) {
        acc[r][j] = dot_bf16_pairs(acc[r][j], wv[j], xv);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < J; ++j) {
      acc_rows[r * kTaskChannels + j] = FloatVec(acc[r][j]);
    }
  }
}
#endif

// dot_tile for a run-time row count in [1, R]; input_t: float (the
// widened rows) or, for the vdpbf16ps path, bfloat16.
template <int J, typename scalar_t, int R, typename input_t>
void dot_rows(int rows, const input_t* x, const scalar_t* w, int64_t k, int64_t begin, int64_t end,
              int64_t ahead, FloatVec* acc_rows) {
  if constexpr (R > 1) {
    if (rows < R) {
      dot_rows<J, scalar_t, R - 1>(rows, x, w, k, begin, end, ahead, acc_rows);
      return;
    }
  }
  dot_tile<R, J>(x, w, k, begin, end, ahead, acc_rows);
}

// One task's channels [c_begin, c_end) over the steps [begin, end) of the
// m rows: stripes of J weight rows, each read once.
template <int J, int R, typename scalar_t, typename input_t>
void task_chunk_with(int m, int64_t k, int64_t c_begin, int64_t c_end, int64_t begin, int64_t end,
                     const input_t* x, const scalar_t* w, FloatVec* acc) {
  // What each load prefetches, into L2: the same elements of the next
  // stripe (J rows on) when a stripe is at most kNextStripeBytes, else
  // kStreamPrefetchBytes further along its own row. A row prefetching
  // along itself runs past its end into rows already being read, and the
  // next stripe's rows start cold. Measured at M = 1, bfloat16, 2 cores of
  // an AMD EPYC (Zen 4), rows of 1024: 17-22 GB/s prefetching along the
  // rows into L1, 25-29 GB/s with the next stripe into L2; the AVX2 build
  // 14 -> 28 GB/s (1024 x 1024); rows of 4096 26 -> 29-36.
  const int64_t ahead = J * k * static_cast<int64_t>(sizeof(scalar_t)) <= kNextStripeBytes
                            ? J * k
                            : kStreamPrefetchBytes / static_cast<int64_t>(sizeof(scalar_t));
  int64_t c = c_begin;
  for (; c + J <= c_end; c += J) {
    dot_rows<J, scalar_t, R>(m, x, w + c * k, k, begin, end, ahead, acc + (c - c_begin));
  }
  for (; c < c_end; ++c) {
    dot_rows<1, scalar_t, R>(m, x, w + c * k, k, begin, end, ahead, acc + (c - c_begin));
  }
}

// The stripes' height J depends on the rows, not the sums: every output
// keeps its own accumulator over the same steps.
template <typename scalar_t, typename input_t>
void task_chunk(int m, int64_t k, int64_t c_begin, int64_t c_end, int64_t begin, int64_t end,
                const input_t* x, const scalar_t* w, FloatVec* acc) {
  if (m == 1) {
    task_chunk_with<kSingleRowStripeRows, 1>(m, k, c_begin, c_end, begin, end, x, w, acc);
  } else if (m <= kNarrowRows) {
    task_chunk_with<kStripeRows, kNarrowRows>(m, k, c_begin, c_end, begin, end, x, w, acc);
  } else {
    task_chunk_with<kWideStripeRows, kMaxRows>(m, k, c_begin, c_end, begin, end, x, w, acc);
  }
}

template <typename scalar_t>
void stream_linear(const at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
                   const at::Tensor& bias) {
  using Wv = Widen<scalar_t>;
  const int64_t m = input.size(0);
  const int64_t k = input.size(1);
  const int64_t n = weight.size(0);
  // The whole steps of K (the tail is summed in scalars, last).
  const int64_t vectorized = k - k % Wv::kSteps;
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  bool pairs = false;  // vdpbf16ps on the rows as they are
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    pairs = kCpuHasAvx512Bf16;
  }
#endif
  const float* x = nullptr;
  // The rows widened to float32 (in Widen's layout) once per call; the
  // buffer is kept by the calling thread, so decoding allocates nothing.
  thread_local std::vector<float> widened;
  if constexpr (std::is_same_v<scalar_t, float>) {
    x = input.const_data_ptr<float>();
  } else if (!pairs) {
    widened.resize(static_cast<size_t>(m * k));
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t i = 0; i < k; ++i) {
        widened[r * k + Wv::place(i, vectorized)] = static_cast<float>(in[r * k + i]);
      }
    }
    x = widened.data();
  }
  const scalar_t* w = weight.const_data_ptr<scalar_t>();
  const scalar_t* b = bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr;
  scalar_t* o = out.mutable_data_ptr<scalar_t>();
  // Steps per K chunk: the rows' chunk within kChunkBytes (whole K when it
  // fits). The chunks change where the accumulators are kept, not the order
  // of any lane's sum.
  const int64_t chunk_steps =
      std::max<int64_t>(1, kChunkBytes / static_cast<int64_t>(sizeof(float) * m * Wv::kSteps));
  const int64_t chunk = chunk_steps * Wv::kSteps;
  const int64_t tasks = (n + kTaskChannels - 1) / kTaskChannels;
  at::parallel_for(0, tasks, 1, [&](int64_t task_begin, int64_t task_end) {
    // One vector accumulator per row and channel of the task.
    std::array<FloatVec, kMaxRows * kTaskChannels> acc;
    for (int64_t task = task_begin; task < task_end; ++task) {
      const int64_t c_begin = task * kTaskChannels;
      const int64_t c_end = std::min(n, c_begin + kTaskChannels);
      acc.fill(FloatVec(0.0f));
      for (int64_t begin = 0; begin < vectorized; begin += chunk) {
        const int64_t end = std::min(vectorized, begin + chunk);
#if defined(CPU_CAPABILITY_AVX512)
        if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
          if (pairs) {
            task_chunk(static_cast<int>(m), k, c_begin, c_end, begin, end, in, w, acc.data());
            continue;
          }
        }
#endif
        task_chunk(static_cast<int>(m), k, c_begin, c_end, begin, end, x, w, acc.data());
      }
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t c = c_begin; c < c_end; ++c) {
          float sum = sum_lanes(acc[r * kTaskChannels + (c - c_begin)]);
          for (int64_t i = vectorized; i < k; ++i) {
            const float xi = pairs ? static_cast<float>(in[r * k + i]) : x[r * k + i];
            sum = std::fma(xi, static_cast<float>(w[c * k + i]), sum);
          }
          if (b != nullptr) {
            sum += static_cast<float>(b[c]);
          }
          o[r * n + c] = static_cast<scalar_t>(sum);
        }
      }
    }
  });
}

void linear_kernel_impl(const at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
                        const at::Tensor& bias) {
  const int64_t rows = input.size(0);
  const at::ScalarType dtype = input.scalar_type();
  int64_t stream_rows =
      detail::reduced_gemms_emulated(dtype) ? kLinearStreamRowsEmulated : kLinearStreamRows;
#if defined(CPU_CAPABILITY_AVX512)
  // bfloat16 on CPUs with AVX512_BF16 and no AMX: the vdpbf16ps stream up
  // to 8 rows too (reduced_gemms.h).
  if (dtype == at::kBFloat16 && kCpuHasAvx512Bf16 && detail::bfloat16_dot_products_without_amx()) {
    stream_rows = kLinearStreamRowsEmulated;
  }
#endif
  if (rows > stream_rows || dtype == at::kDouble) {
    if (detail::linear_runs_widened(weight, rows)) {
      detail::WidenedWeight widened(weight, rows);
      detail::widened_linear(out, input, widened, bias);
      return;
    }
    at::Tensor result = out;
    if (bias.defined()) {
      at::addmm_out(result, bias, input, weight.t());
    } else {
      at::mm_out(result, input, weight.t());
    }
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::linear",
                                  [&] {
                                    if constexpr (!std::is_same_v<scalar_t, double>) {
                                      stream_linear<scalar_t>(out, input, weight, bias);
                                    }
                                  });
}

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(LinearCpuKernels::forward, &linear_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
