// int4_dynamic_linear (W4A8) CPU kernels; compiled once per CPU capability.
//
// The weight is int4_weight_only_linear's packed layout (blocks of 16 output
// channels, one 16-byte row per pair of K positions, the even position in
// the low nibble; cpp/include/fuseops/int4_linear.h). The activations are
// quantized to int8 per weight group along K first (each group of
// `group_size` values of a row gets its own scale, absmax / 127: llama.cpp's
// Q8_1 blocks; quantize_per_token_int8's math within the group), and the
// products of 4-bit weights by int8 activations are summed in int32,
// exactly, group by group; the group's zero point and the product of the
// weight's and the activations' scales are applied to that integer sum in
// float32:
//   y[m, n] = sum_g (scale[g, n] * x_scale[m, g]) * (sum_k q[k, n] xq[m, k]
//                                                   - zero[g, n] * sum_k xq[m, k])
// One scale per row, as this op had before, cost real models 4% perplexity
// (SmolLM2-135M, against 0.6% for W4A16): a row's largest activation, often
// an outlier channel, set the step for every other. Per group the step
// follows the values it quantizes.
// The integer sums do not depend on how they are computed, and the float32
// epilogue is the same fused multiply-adds in the same order everywhere, so
// every CPU build and path returns the same bits, and a row does not depend
// on the rows around it.
//
// Paths, by how the int32 sums are formed:
//  - AVX-512 with AVX512_VNNI: four rows of 16 bytes (8 K positions of the
//    block's 16 channels) are one 64-byte load; a permutation of its dwords
//    (vpermd) and of the bytes within each 128-bit lane (vpshufb) put the
//    four bytes of channel c in int32 lane c; a mask and a shift split the
//    nibbles (the even positions, then the odd ones), and vpdpbusd
//    multiplies each by four activations (unsigned weights 0..15 by signed
//    int8) and adds the four products to the lane: two instructions per row
//    for 128 weights, which keeps a decode step bound by the weight's bytes.
//  - AVX2 and AVX-512 without VNNI: a row of 16 bytes widened to 16-bit
//    lanes, split into nibbles and interleaved into (even, odd) pairs per
//    channel; vpmaddwd multiplies each pair by the two activations and adds
//    them into the channel's int32 lane.
//  - DEFAULT: plain int32 loops.
// The activations of a row are stored group by group, each group padded to
// a multiple of 8 positions and each 8 reordered as (x0 x2 x4 x6 x1 x3 x5
// x7), the order the VNNI path's lanes hold the weights in.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include "ops/cpu/elementwise.h"
#include "ops/cpu/int4_channels.h"
#include "ops_generated/cpu/int4_linear.h"
#include "ops/cpu/int8_vec.h"
#include "ops/cpu/prefetch.h"
#include "ops/cpu/quantize_row.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

constexpr int64_t kBlockN = detail::kInt4BlockN;
constexpr int64_t W = FloatVec::size();
constexpr int V = static_cast<int>(kBlockN / W);
// Rows per tile: each tile streams a group of the block's weights once (from
// L1 after the first tile of a task) and keeps its rows' sums in registers.
constexpr int kTileRows = per_build(8, 4, 1);
constexpr int64_t kChunkRows = 4 * kTileRows;

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

C10_ALWAYS_INLINE int32_t load_four(const int8_t* p) {
  int32_t four;
  std::memcpy(&four, p, sizeof(four));
  return four;
}

// One group of one block: the pairs of K positions it holds (the last step
// may run past them, over zero weights or bytes masked off), its weights,
// and R rows of arranged activations `x_stride` bytes apart.
struct GroupDot {
  const uint8_t* w;
  int64_t pairs;
  const int8_t* x;
  int64_t x_stride;
};

#if defined(CPU_CAPABILITY_AVX512)
// sums[r][c] = sum over the group of q[k, c] * xq[r, k], with VNNI.
template <int R>
C10_ALWAYS_INLINE void group_sums_vnni(const GroupDot& d, int32_t (*sums)[kBlockN]) {
  // dword j of the result takes dword (j % 4) * 4 + j / 4: 128-bit lane L
  // then holds channels 4L..4L+3 of each of the four rows.
  const __m512i dwords = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  // Within a lane: the 4 x 4 bytes [row][channel] to [channel][row].
  const __m512i bytes =
      _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512i even[R];
  __m512i odd[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    even[r] = _mm512_setzero_si512();
    odd[r] = _mm512_setzero_si512();
  }
  for (int64_t p = 0; p < d.pairs; p += 4) {
    prefetch_ahead(d.w + p * kBlockN);  // one 64-byte line per 4 pairs
    const int64_t rows = std::min<int64_t>(4, d.pairs - p);
    const __m512i raw =
        rows == 4
            ? _mm512_loadu_si512(d.w + p * kBlockN)
            : _mm512_maskz_loadu_epi8((__mmask64)((~0ULL) >> (64 - 16 * rows)), d.w + p * kBlockN);
    const __m512i lanes = _mm512_shuffle_epi8(_mm512_permutexvar_epi32(dwords, raw), bytes);
    const __m512i lo = _mm512_and_si512(lanes, nibble);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(lanes, 4), nibble);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const int8_t* x = d.x + r * d.x_stride + 2 * p;
      even[r] = dot_u8_s8(even[r], lo, _mm512_set1_epi32(load_four(x)));
      odd[r] = dot_u8_s8(odd[r], hi, _mm512_set1_epi32(load_four(x + 4)));
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_si512(sums[r], _mm512_add_epi32(even[r], odd[r]));
  }
}
#endif

// The same by pairs of 16-bit products (AVX2, AVX-512 without VNNI) or
// plain loops (DEFAULT).
template <int R>
C10_ALWAYS_INLINE void group_sums_pairs(const GroupDot& d, int32_t (*sums)[kBlockN]) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  // Lane layout after the interleave: `low` holds channels 0-3 and 8-11,
  // `high` channels 4-7 and 12-15 (vpunpck works within 128-bit halves).
  const __m256i nibble = _mm256_set1_epi16(0x0F);
  __m256i low[R];
  __m256i high[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    low[r] = _mm256_setzero_si256();
    high[r] = _mm256_setzero_si256();
  }
  for (int64_t p = 0; p < d.pairs; ++p) {
    if (p % 4 == 0) {
      prefetch_ahead(d.w + p * kBlockN);  // one 64-byte line per 4 pairs
    }
    const __m256i w16 =
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d.w + p * kBlockN)));
    const __m256i lo = _mm256_and_si256(w16, nibble);
    const __m256i hi = _mm256_srli_epi16(w16, 4);
    const __m256i pairs_low = _mm256_unpacklo_epi16(lo, hi);
    const __m256i pairs_high = _mm256_unpackhi_epi16(lo, hi);
    // Position 2p' of the group's arranged 8 (p' = p % 4) is at p', 2p'+1 at 4 + p'.
    const int64_t base = (p / 4) * 8 + (p % 4);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const int8_t* x = d.x + r * d.x_stride;
      const int32_t two =
          static_cast<int32_t>(static_cast<uint16_t>(static_cast<int16_t>(x[base]))) |
          static_cast<int32_t>(static_cast<uint32_t>(static_cast<int16_t>(x[base + 4])) << 16);
      const __m256i xv = _mm256_set1_epi32(two);
      low[r] = _mm256_add_epi32(low[r], _mm256_madd_epi16(pairs_low, xv));
      high[r] = _mm256_add_epi32(high[r], _mm256_madd_epi16(pairs_high, xv));
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    alignas(32) int32_t a[8];
    alignas(32) int32_t b[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(a), low[r]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(b), high[r]);
    for (int c = 0; c < 4; ++c) {
      sums[r][c] = a[c];
      sums[r][8 + c] = a[4 + c];
      sums[r][4 + c] = b[c];
      sums[r][12 + c] = b[4 + c];
    }
  }
#else
  for (int r = 0; r < R; ++r) {
    std::fill(sums[r], sums[r] + kBlockN, 0);
  }
  for (int64_t p = 0; p < d.pairs; ++p) {
    const uint8_t* row = d.w + p * kBlockN;
    const int64_t base = (p / 4) * 8 + (p % 4);
    for (int r = 0; r < R; ++r) {
      const int32_t x_even = d.x[r * d.x_stride + base];
      const int32_t x_odd = d.x[r * d.x_stride + base + 4];
      for (int64_t c = 0; c < kBlockN; ++c) {
        sums[r][c] +=
            static_cast<int32_t>(row[c] & 0xF) * x_even + static_cast<int32_t>(row[c] >> 4) * x_odd;
      }
    }
  }
#endif
}

template <int R>
void group_sums(bool vnni, const GroupDot& d, int32_t (*sums)[kBlockN]) {
#if defined(CPU_CAPABILITY_AVX512)
  if (vnni) {
    group_sums_vnni<R>(d, sums);
    return;
  }
#endif
  (void)vnni;
  group_sums_pairs<R>(d, sums);
}

// group_sums<rows> for a run-time rows in [1, R].
template <int R>
void group_sums_rows(int rows, bool vnni, const GroupDot& d, int32_t (*sums)[kBlockN]) {
  if constexpr (R > 1) {
    if (rows < R) {
      group_sums_rows<R - 1>(rows, vnni, d, sums);
      return;
    }
  }
  group_sums<R>(vnni, d, sums);
}

C10_ALWAYS_INLINE uint64_t load_word(const int8_t* p) {
  uint64_t word;
  std::memcpy(&word, p, sizeof(word));
  return word;
}

// The bytes (b0 b1 ... b7) of a little-endian word as (b0 b2 b4 b6 b1 b3 b5
// b7): each half's bytes moved together by two shifts.
C10_ALWAYS_INLINE uint64_t evens_then_odds(uint64_t word) {
  auto gather = [](uint64_t every_other) {
    every_other = (every_other | (every_other >> 8)) & 0x0000ffff0000ffffull;
    return (every_other | (every_other >> 16)) & 0x00000000ffffffffull;
  };
  constexpr uint64_t kLowBytes = 0x00ff00ff00ff00ffull;
  return gather(word & kLowBytes) | (gather((word >> 8) & kLowBytes) << 32);
}

template <typename scalar_t>
void dynamic_linear(const at::Tensor& out, const at::Tensor& input, const at::Tensor& packed,
                    const at::Tensor& scale_zero, int64_t group_size, const at::Tensor& bias) {
  const int64_t m_total = input.size(0);
  const int64_t k = input.size(1);
  const int64_t n = scale_zero.size(2);
  const int64_t groups = scale_zero.size(0);
  const int64_t blocks = packed.size(0);
  // Each group's activations padded to whole steps of 8 positions, plus 8
  // bytes that a last partial step may read (against zero weights).
  const int64_t group_stride = round_up(group_size, 8);
  const int64_t x_stride = groups * group_stride + 8;
#if defined(CPU_CAPABILITY_AVX512)
  const bool vnni = kUseAvx512Vnni;
#else
  const bool vnni = false;
#endif

  // Per row and group: the arranged int8 activations, their scale, and their
  // sum (the zero points' share).
  thread_local std::vector<int8_t> reused_xq;
  thread_local std::vector<float> reused_scales;
  thread_local std::vector<int32_t> reused_sums;
  std::vector<int8_t> fresh_xq;
  const size_t xq_bytes = static_cast<size_t>(m_total * x_stride);
  std::vector<int8_t>& xq_buffer = xq_bytes <= (size_t{1} << 20) ? reused_xq : fresh_xq;
  xq_buffer.resize(std::max(xq_buffer.size(), xq_bytes));
  const size_t row_groups = static_cast<size_t>(m_total * groups);
  reused_scales.resize(std::max(reused_scales.size(), row_groups));
  reused_sums.resize(std::max(reused_sums.size(), row_groups));
  int8_t* xq = xq_buffer.data();
  float* x_scale = reused_scales.data();
  int32_t* x_sums = reused_sums.data();
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  at::parallel_for(0, m_total, row_grain(k), [&](int64_t begin, int64_t end) {
    std::vector<float> widened;
    std::vector<int8_t> plain(static_cast<size_t>(group_size));
    for (int64_t m = begin; m < end; ++m) {
      int8_t* row = xq + m * x_stride;
      std::fill(row, row + x_stride, int8_t{0});
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t start = g * group_size;
        const int64_t count = std::min(k, start + group_size) - start;
        // Inf or NaN in the group: its scale is NaN and its q are 0, so
        // every output of the row comes out NaN.
        x_scale[m * groups + g] = quantize_row_for_dot(in + m * k + start, count, plain.data(),
                                                       /*shift=*/false, widened);
        const int8_t* from = plain.data();
        int8_t* to = row + g * group_stride;
        int32_t sum = 0;
        for (int64_t j = 0; j < count; ++j) {
          sum += from[j];
        }
        x_sums[m * groups + g] = sum;
        // (x0 x2 x4 x6 x1 x3 x5 x7) within each 8: whole eights as one word.
        const int64_t whole = count - count % 8;
        for (int64_t j = 0; j < whole; j += 8) {
          const uint64_t arranged = evens_then_odds(load_word(from + j));
          std::memcpy(to + j, &arranged, sizeof(arranged));
        }
        for (int64_t j = whole; j < count; ++j) {
          to[j - j % 8 + (j % 2) * 4 + (j % 8) / 2] = from[j];
        }
      }
    }
  });

  const uint8_t* w = packed.const_data_ptr<uint8_t>();
  const ScaleZeroRows scale_zero_rows(scale_zero);
  const scalar_t* b = bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr;
  scalar_t* o = out.mutable_data_ptr<scalar_t>();
  const int64_t chunk_rows = m_total <= kTileRows ? m_total : kChunkRows;
  const int64_t chunks = (m_total + chunk_rows - 1) / chunk_rows;
  const int64_t pairs = group_size / 2;
  const int64_t block_bytes = packed.size(1) * kBlockN;

  at::parallel_for(0, blocks * chunks, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float result[kChunkRows][kBlockN];
    alignas(64) int32_t sums[kTileRows][kBlockN];
    for (int64_t task = begin; task < end; ++task) {
      const auto [block, m_begin, m_end, channel0, channels] =
          Int4Task::of(task, chunks, chunk_rows, m_total, n);
      const uint8_t* wb = w + block * block_bytes;
      for (int64_t g = 0; g < groups; ++g) {
        FloatVec scale[V];
        FloatVec neg_zero[V];
        scale_zero_rows.load(g, channel0, channels, scale, neg_zero);
        for (int64_t m = m_begin; m < m_end; m += kTileRows) {
          const int rows = static_cast<int>(std::min<int64_t>(kTileRows, m_end - m));
          const GroupDot d{wb + g * pairs * kBlockN, pairs, xq + m * x_stride + g * group_stride,
                           x_stride};
          group_sums_rows<kTileRows>(rows, vnni, d, sums);
          for (int r = 0; r < rows; ++r) {
            const FloatVec x_sum(static_cast<float>(x_sums[(m + r) * groups + g]));
            const FloatVec xs(x_scale[(m + r) * groups + g]);
            float* acc = result[m - m_begin + r];
            for (int v = 0; v < V; ++v) {
              const FloatVec dot =
                  fused_multiply_add(neg_zero[v], x_sum, load_int32_as_float(sums[r] + v * W));
              const FloatVec before = g == 0 ? FloatVec(0.0f) : FloatVec::loadu(acc + v * W);
              fused_multiply_add(scale[v] * xs, dot, before).store(acc + v * W);
            }
          }
        }
      }
      for (int64_t m = m_begin; m < m_end; ++m) {
        store_output_channels(o + m * n + channel0, result[m - m_begin], channels, 1.0f,
                              b != nullptr ? b + channel0 : nullptr);
      }
    }
  });
}

void int4_dynamic_linear_kernel_impl(const at::Tensor& out, const at::Tensor& input,
                                     const at::Tensor& packed, const at::Tensor& scale_zero,
                                     int64_t group_size, const at::Tensor& bias) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::int4_dynamic_linear",
      [&] { dynamic_linear<scalar_t>(out, input, packed, scale_zero, group_size, bias); });
}

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(Int4LinearCpuKernels::dynamic, &int4_dynamic_linear_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
