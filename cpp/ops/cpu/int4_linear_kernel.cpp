// int4 linear CPU kernels; compiled once per CPU capability.
//
// W4A16 (int4_weight_only_linear): the packed weight is blocks of 16 output
// channels, each a run of 16-byte rows, one row per pair of K positions
// (byte c: channel c's value at the even position in the low nibble, the
// odd one in the high nibble; cpp/include/fuseops/int4_linear.h). Lanes are
// channels: a row of bytes decodes to one vector of 16 channels' values q at
// the even position and one at the odd position (a zero-extension, a mask
// and a shift, two conversions: the decode is most of the work at decode
// sizes), and each is multiplied by that position's activation broadcast
// across the vector. Two accumulators per row and vector (even and odd
// positions) keep two independent chains of fused multiply-adds in flight.
// The zero point is not taken off each weight but once per group: sum_k x_k
// (q_k - z) = sum_k x_k q_k - z * sum_k x_k, with each row's sum of
// activations over the group computed beforehand; then the group's scale
// multiplies the difference, added to the row's result.
//
// Work is split over (block of 16 channels) x (chunk of rows) tasks. At
// decode sizes (few rows, kDirectRows at most) the blocks alone feed every
// thread and each thread streams its share of the weight once, decoding in
// registers: the weight's bytes are the bound. With more rows, a task
// decodes one group of its block at a time into a float32 buffer in L1 and
// runs every tile of its rows over it, so the weight is still read from
// memory once and decoded once per chunk of rows.
//
// Every lane sums in the same order whatever the number of rows, the path or
// the CPU build (fused multiply-adds everywhere, std::fma in the DEFAULT
// build), so every build returns the same bits and a row's result does not
// depend on the rows around it.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include "ops/cpu/elementwise.h"
#include "ops/cpu/int4_linear.h"
#include "ops/cpu/int8_vec.h"
#include "ops/cpu/prefetch.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

constexpr int64_t W = FloatVec::size();
constexpr int64_t kBlockN = detail::kInt4BlockN;
// Vectors per block of 16 channels.
constexpr int V = static_cast<int>(kBlockN / W);
// Rows decoded from registers in one pass (the decode path), and rows per
// tile over a decoded group (the buffered path): two accumulators per row
// and vector, within the register file (32 vectors with AVX-512, 16
// otherwise) beside the weights, zero points and broadcasts.
#if defined(CPU_CAPABILITY_AVX512)
constexpr int kDirectRows = 8;
constexpr int kTileRows = 8;
#elif defined(CPU_CAPABILITY_AVX2)
constexpr int kDirectRows = 2;
constexpr int kTileRows = 3;
#else
constexpr int kDirectRows = 1;
constexpr int kTileRows = 1;
#endif
// Rows per task of the buffered path: each decoded group is reused by all.
constexpr int64_t kChunkRows = 4 * kTileRows;

// One row of 16 bytes decoded: channel c's value q at the even position of
// the pair in lane c of `even`, at the odd one in `odd`.
C10_ALWAYS_INLINE void decode_pair(const uint8_t* p, FloatVec* even, FloatVec* odd) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  even[0] = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(0xF)));
  odd[0] = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
#elif defined(CPU_CAPABILITY_AVX2)
  const __m256i mask = _mm256_set1_epi32(0xF);
  for (int v = 0; v < 2; ++v) {
    const __m256i bytes =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * v)));
    even[v] = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, mask));
    odd[v] = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4));
  }
#else
  float low[kBlockN];
  float high[kBlockN];
  for (int64_t c = 0; c < kBlockN; ++c) {
    low[c] = static_cast<float>(p[c] & 0xF);
    high[c] = static_cast<float>(p[c] >> 4);
  }
  for (int v = 0; v < V; ++v) {
    even[v] = FloatVec::loadu(low + v * W);
    odd[v] = FloatVec::loadu(high + v * W);
  }
#endif
}

// The 16 values of one block's channels in a row of scale_zero (`count`
// of them real, the rest 0) as V vectors.
C10_ALWAYS_INLINE void load_channels(const float* p, int64_t count, FloatVec* out) {
  float lanes[kBlockN] = {};
  std::memcpy(lanes, p, sizeof(float) * static_cast<size_t>(count));
  for (int v = 0; v < V; ++v) {
    out[v] = FloatVec::loadu(lanes + v * W);
  }
}

// What the tile functions need of one group of one block: its channels'
// scales and negated zero points, the group's length in pairs of K
// positions, and where the rows' sums of activations over it are (one
// float per row, `sums_stride` apart).
struct Group {
  FloatVec scale[V];
  FloatVec neg_zero[V];
  int64_t pairs;
  const float* sums;
  int64_t sums_stride;
};

// R rows' sums over one group, from the even and odd accumulators: less the
// zero points' share, scaled and added to `result` (R x 16 floats; `first`:
// start from 0).
//
// Every loop over rows and vectors here and in the tiles is unrolled in
// full: an accumulator array indexed in a loop lives in memory, and GCC
// then loads and stores it around every multiply-add of the hot loop (it did
// so for two rows: three times the time of one row).
template <int R>
C10_ALWAYS_INLINE void finish_group(const Group& group, FloatVec (&even)[R][V],
                                    FloatVec (&odd)[R][V], float* result, bool first) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const FloatVec x_sum(group.sums[r * group.sums_stride]);
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
      const FloatVec dot = fused_multiply_add(group.neg_zero[v], x_sum, even[r][v] + odd[r][v]);
      const FloatVec before =
          first ? FloatVec(0.0f) : FloatVec::loadu(result + r * kBlockN + v * W);
      fused_multiply_add(group.scale[v], dot, before).store(result + r * kBlockN + v * W);
    }
  }
}

// R rows (x rows `x_stride` floats apart, from the group's first position)
// over one group of the block's packed weight `w`, decoded in registers.
template <int R>
C10_ALWAYS_INLINE void direct_tile(const float* x, int64_t x_stride, const uint8_t* w,
                                   const Group& group, float* result, bool first) {
  FloatVec even[R][V];
  FloatVec odd[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
      even[r][v] = FloatVec(0.0f);
      odd[r][v] = FloatVec(0.0f);
    }
  }
  for (int64_t p = 0; p < group.pairs; ++p) {
    if (p % 4 == 0) {
      prefetch_ahead(w + p * kBlockN);  // one 64-byte line per 4 pairs
    }
    FloatVec we[V];
    FloatVec wo[V];
    decode_pair(w + p * kBlockN, we, wo);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const FloatVec xe(x[r * x_stride + 2 * p]);
      const FloatVec xo(x[r * x_stride + 2 * p + 1]);
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) {
        even[r][v] = fused_multiply_add(we[v], xe, even[r][v]);
        odd[r][v] = fused_multiply_add(wo[v], xo, odd[r][v]);
      }
    }
  }
  finish_group<R>(group, even, odd, result, first);
}

// The same over a group already decoded into `decoded` (per position, 16
// floats: the channels' values q).
template <int R>
C10_ALWAYS_INLINE void buffered_tile(const float* x, int64_t x_stride, const float* decoded,
                                     const Group& group, float* result, bool first) {
  FloatVec even[R][V];
  FloatVec odd[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
      even[r][v] = FloatVec(0.0f);
      odd[r][v] = FloatVec(0.0f);
    }
  }
  for (int64_t p = 0; p < group.pairs; ++p) {
    const float* we = decoded + 2 * p * kBlockN;
    const float* wo = we + kBlockN;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const FloatVec xe(x[r * x_stride + 2 * p]);
      const FloatVec xo(x[r * x_stride + 2 * p + 1]);
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) {
        even[r][v] = fused_multiply_add(FloatVec::loadu(we + v * W), xe, even[r][v]);
        odd[r][v] = fused_multiply_add(FloatVec::loadu(wo + v * W), xo, odd[r][v]);
      }
    }
  }
  finish_group<R>(group, even, odd, result, first);
}

// tile<rows> for a run-time rows in [1, R].
template <bool kBuffered, int R>
void tile_rows(int rows, const float* x, int64_t x_stride, const uint8_t* w, const float* decoded,
               const Group& group, float* result, bool first) {
  if constexpr (R > 1) {
    if (rows < R) {
      tile_rows<kBuffered, R - 1>(rows, x, x_stride, w, decoded, group, result, first);
      return;
    }
  }
  if constexpr (kBuffered) {
    buffered_tile<R>(x, x_stride, decoded, group, result, first);
  } else {
    direct_tile<R>(x, x_stride, w, group, result, first);
  }
}

// Activations as float32 rows of whole groups (zeros past K) and their sums
// over each group: buffers reused from call to call on the calling thread
// up to this many floats, so that decode steps allocate nothing.
constexpr size_t kReusedActivationFloats = size_t{1} << 18;

// `floats` floats from `reused` when they are few, else from `fresh`.
float* scratch(std::vector<float>& reused, std::vector<float>& fresh, size_t floats) {
  std::vector<float>& buffer = floats <= kReusedActivationFloats ? reused : fresh;
  buffer.resize(std::max(buffer.size(), floats));
  return buffer.data();
}

template <typename scalar_t>
void weight_only_linear(const at::Tensor& out, const at::Tensor& input, const at::Tensor& packed,
                        const at::Tensor& scale_zero, int64_t group_size, const at::Tensor& bias) {
  const int64_t m_total = input.size(0);
  const int64_t k = input.size(1);
  const int64_t n = scale_zero.size(2);
  const int64_t groups = scale_zero.size(0);
  const int64_t blocks = packed.size(0);
  const int64_t k_padded = groups * group_size;
  const scalar_t* in = input.const_data_ptr<scalar_t>();

  const float* x = nullptr;
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (k == k_padded) {
      x = in;
    }
  }
  thread_local std::vector<float> reused_rows;
  thread_local std::vector<float> reused_sums;
  std::vector<float> fresh_rows;
  std::vector<float> fresh_sums;
  float* widened = x == nullptr
                       ? scratch(reused_rows, fresh_rows, static_cast<size_t>(m_total * k_padded))
                       : nullptr;
  // sums[m * groups + g]: row m's activations summed over group g, in
  // order, from 0 (the zero points' share; every build sums alike).
  float* sums = scratch(reused_sums, fresh_sums, static_cast<size_t>(m_total * groups));
  at::parallel_for(0, m_total, row_grain(k), [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      if (widened != nullptr) {
        for (int64_t i = 0; i < k; ++i) {
          widened[m * k_padded + i] = static_cast<float>(in[m * k + i]);
        }
        std::fill(widened + m * k_padded + k, widened + (m + 1) * k_padded, 0.0f);
      }
      const float* row = (widened != nullptr ? widened : x) + m * k_padded;
      for (int64_t g = 0; g < groups; ++g) {
        float sum = 0.0f;
        for (int64_t i = g * group_size; i < (g + 1) * group_size; ++i) {
          sum += row[i];
        }
        sums[m * groups + g] = sum;
      }
    }
  });
  if (widened != nullptr) {
    x = widened;
  }

  const uint8_t* w = packed.const_data_ptr<uint8_t>();
  const float* sz = scale_zero.const_data_ptr<float>();
  const scalar_t* b = bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr;
  scalar_t* o = out.mutable_data_ptr<scalar_t>();
  const bool direct = m_total <= kDirectRows;
  const int64_t chunk_rows = direct ? m_total : kChunkRows;
  const int64_t chunks = (m_total + chunk_rows - 1) / chunk_rows;
  const int64_t pairs = group_size / 2;
  const int64_t block_bytes = packed.size(1) * kBlockN;

  at::parallel_for(0, blocks * chunks, 1, [&](int64_t begin, int64_t end) {
    float result[kChunkRows > kDirectRows ? kChunkRows * kBlockN : kDirectRows * kBlockN];
    std::vector<float> decoded(direct ? 0 : static_cast<size_t>(group_size * kBlockN));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t block = task / chunks;
      const int64_t m_begin = (task % chunks) * chunk_rows;
      const int64_t m_end = std::min(m_total, m_begin + chunk_rows);
      const int64_t channel0 = block * kBlockN;
      const int64_t channels = std::min(kBlockN, n - channel0);
      const uint8_t* wb = w + block * block_bytes;
      for (int64_t g = 0; g < groups; ++g) {
        Group group;
        group.pairs = pairs;
        group.sums_stride = groups;
        prefetch_next_block_channels(sz, n, g, channel0 + kBlockN);
        load_channels(sz + (2 * g) * n + channel0, channels, group.scale);
        load_channels(sz + (2 * g + 1) * n + channel0, channels, group.neg_zero);
        for (int v = 0; v < V; ++v) {
          group.neg_zero[v] = group.neg_zero[v].neg();
        }
        const uint8_t* wg = wb + g * pairs * kBlockN;
        const float* xg = x + g * group_size;
        if (direct) {
          group.sums = sums + m_begin * groups + g;
          tile_rows<false, kDirectRows>(static_cast<int>(m_end - m_begin), xg + m_begin * k_padded,
                                        k_padded, wg, nullptr, group, result, g == 0);
          continue;
        }
        for (int64_t p = 0; p < pairs; ++p) {
          FloatVec we[V];
          FloatVec wo[V];
          decode_pair(wg + p * kBlockN, we, wo);
          for (int v = 0; v < V; ++v) {
            we[v].store(decoded.data() + 2 * p * kBlockN + v * W);
            wo[v].store(decoded.data() + (2 * p + 1) * kBlockN + v * W);
          }
        }
        for (int64_t m = m_begin; m < m_end; m += kTileRows) {
          group.sums = sums + m * groups + g;
          tile_rows<true, kTileRows>(static_cast<int>(std::min<int64_t>(kTileRows, m_end - m)),
                                     xg + m * k_padded, k_padded, nullptr, decoded.data(), group,
                                     result + (m - m_begin) * kBlockN, g == 0);
        }
      }
      for (int64_t m = m_begin; m < m_end; ++m) {
        store_output_channels(o + m * n + channel0, result + (m - m_begin) * kBlockN, channels,
                              1.0f, b != nullptr ? b + channel0 : nullptr);
      }
    }
  });
}

void int4_weight_only_linear_kernel_impl(const at::Tensor& out, const at::Tensor& input,
                                         const at::Tensor& packed, const at::Tensor& scale_zero,
                                         int64_t group_size, const at::Tensor& bias) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::int4_weight_only_linear",
      [&] { weight_only_linear<scalar_t>(out, input, packed, scale_zero, group_size, bias); });
}

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(Int4LinearCpuKernels::weight_only,
                            &int4_weight_only_linear_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
