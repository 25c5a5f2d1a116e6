// int8 linear CPU kernels; compiled once per CPU capability.
//
// W8A16 (int8_weight_only_linear): activations are widened to float32 once
// (rows zero-padded to whole groups of 4); the packed weight (blocks of 16
// output channels x groups of 4 K values, 64 bytes per group: see
// cpp/include/fuseops/int8_linear.h) is widened int8 -> float32 in
// registers (vpmovsxbd + vcvtdq2ps on AVX-512) and multiplied by the four
// activations of the group repeated across the vector. Each vector lane
// accumulates one (channel, k mod 4) pair over K; the four lanes of a
// channel are added and the channel's scale applied once, at the end.
//
// Work is split over (block of 16 channels) x (chunk of rows) tasks: at
// decode sizes (few rows) the blocks alone feed every thread and each
// thread streams its share of the weight once, which is the bound; with
// more rows than one register tile holds, a task widens its block's weights
// slice by slice (16 KiB of float32, in L1) and runs every tile of its rows
// over each slice, keeping the tiles' partial sums in a small buffer, so the
// weights still come from memory once and are converted once per chunk of
// rows rather than once per tile.
//
// Every lane sums in the same order whatever the number of rows or the
// tiling, and every build uses fused multiply-adds (std::fma in the
// DEFAULT build), so a row's result does not depend on the rows around it
// or on the CPU build. The exception: bfloat16 activations on CPUs with
// AVX512_BF16 take the vdpbf16ps path below at every row count (twice the
// multiply-adds per instruction); its sums differ from the float32 path's
// by float32 rounding, and a row still has the same bits whatever the
// batch. (It used to start above one tile of rows, so a row decoded alone
// and the same row in a prefill could differ in the last bit.)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include "ops/common/reduced_gemms.h"
#include "ops/cpu/elementwise.h"
#include "ops_generated/cpu/int8_linear.h"
#include "ops/cpu/int8_vec.h"
#include "ops/cpu/prefetch.h"
#include "ops/cpu/quantize_row.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

constexpr int64_t W = FloatVec::size();
constexpr int64_t kBlockN = detail::kInt8BlockN;
constexpr int64_t kGroupK = detail::kInt8GroupK;
constexpr int64_t kGroupBytes = kBlockN * kGroupK;
constexpr int kChunks = static_cast<int>(kGroupBytes / W);
// How far ahead the float32 path prefetches its int8 weights: each byte
// costs it three instructions (widen, convert, multiply-add), so at
// prefetch.h's distance the lines asked for arrive late. Measured on a Xeon
// with AVX-512 (two threads, one row of bfloat16, 5632 x 2048 weights from
// memory): 745 us at 1 KiB ahead, 513 at 2 KiB, 457 at 4 KiB (25 GB/s, a
// bfloat16 weight's stream rate there).
constexpr int64_t kWidenedStreamPrefetchBytes = 4096;
// Rows per register tile: kChunks accumulators per row, plus the weights'
// kChunks vectors and one for the activations, within the register file
// (32 vectors with AVX-512, 16 otherwise).
constexpr int kTileRows = per_build(6, 1, 1);
// Rows per task: a multiple of the tile; each slice of the block's widened
// weights is reused by all of them.
constexpr int64_t kChunkRows = 8 * kTileRows;
// Groups per widened slice: 64 floats each, 16 KiB in all, held in L1.
constexpr int64_t kWidenGroups = 64;

// p[0..3] repeated across a vector: lane l gets p[l % 4].
C10_ALWAYS_INLINE FloatVec repeat4(const float* p) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_broadcast_f32x4(_mm_loadu_ps(p));
#elif defined(CPU_CAPABILITY_AVX2)
  return _mm256_broadcast_ps(reinterpret_cast<const __m128*>(p));
#else
  float lanes[W];
  for (int64_t l = 0; l < W; ++l) {
    lanes[l] = p[l % 4];
  }
  return FloatVec::loadu(lanes);
#endif
}

// Accumulates, for R rows (x rows `x_stride` floats apart, from group 0 of
// this call) and one block of 16 channels, sum_k x[r][k] * w[c][k] over
// `groups` groups into partial[r * 64 + lane], lane = 4 * c + k % 4 (lane l
// of vector chunk i is byte i * W + l of a group); `first` starts from 0.
// The weights are int8 (`wi`) or the same weights widened to float32 (`wf`).
template <int R, bool kWidened>
C10_ALWAYS_INLINE void tile(const float* x, int64_t x_stride, const int8_t* wi, const float* wf,
                            int64_t groups, float* partial, bool first) {
  FloatVec acc[R][kChunks];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < kChunks; ++c) {
      acc[r][c] = first ? FloatVec(0.0f) : FloatVec::loadu(partial + r * kGroupBytes + c * W);
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    if constexpr (!kWidened) {
      // From memory: one line a group, kWidenedStreamPrefetchBytes ahead.
      prefetch_ahead<kWidenedStreamPrefetchBytes>(wi + g * kGroupBytes);
    }
    FloatVec w[kChunks];
    for (int c = 0; c < kChunks; ++c) {
      w[c] = kWidened ? FloatVec::loadu(wf + g * kGroupBytes + c * W)
                      : load_int8_as_float(wi + g * kGroupBytes + c * W);
    }
    for (int r = 0; r < R; ++r) {
      const FloatVec xv = repeat4(x + r * x_stride + g * kGroupK);
      for (int c = 0; c < kChunks; ++c) {
        acc[r][c] = fused_multiply_add(w[c], xv, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < kChunks; ++c) {
      acc[r][c].store(partial + r * kGroupBytes + c * W);
    }
  }
}

// tile<rows> for a run-time rows in [1, kTileRows].
template <bool kWidened, int R = kTileRows>
void tile_rows(int rows, const float* x, int64_t x_stride, const int8_t* wi, const float* wf,
               int64_t groups, float* partial, bool first) {
  if constexpr (R > 1) {
    if (rows < R) {
      tile_rows<kWidened, R - 1>(rows, x, x_stride, wi, wf, groups, partial, first);
      return;
    }
  }
  tile<R, kWidened>(x, x_stride, wi, wf, groups, partial, first);
}

#if defined(CPU_CAPABILITY_AVX512)
// bfloat16 activations on CPUs with AVX512_BF16, at every row count (so a
// row's bits do not depend on the batch: decode and prefill agree):
// vdpbf16ps multiplies pairs of bfloat16 (the int8
// weights are exact in bfloat16, and so is each product in float32) and
// adds both products to a float32 lane, twice the multiply-adds per
// instruction of the float32 path. A group's weights widen to two vectors
// of bfloat16 pairs: vector h, lane i holds channel 8h + i/2 at k mod 4 in
// {2(i%2), 2(i%2)+1}, and the group's four activations, broadcast as one
// 64-bit word, line up with them. Partial sums: 32 floats per row, lanes
// 2c and 2c+1 belong to channel c. The instruction treats bfloat16 and
// float32 denormals (below about 1.2e-38) as 0.
constexpr int kPairTileRows = 12;

// Half h (0 or 1) of one group of int8 weights as the bfloat16 pairs
// pair_tile multiplies: exact, since |q| <= 127 fits bfloat16's 8 bits.
C10_ALWAYS_INLINE __m512i group_pairs(const int8_t* q, int h) {
  return narrow_from_float<c10::BFloat16, true>(load_int8_as_float(q + 32 * h),
                                                load_int8_as_float(q + 32 * h + 16));
}

// Where pair_tile takes group g's pairs from: a group's halves made in
// registers from the packed int8 weights as they are read from memory
// (calls of at most one float32 tile of rows: decode sizes), or loaded from
// the L1 buffer widen_to_pairs fills for the tiles of more rows. The same
// pairs either way, so the same bits.
// From memory, the weights are prefetched as the float32 path's are (one
// line a group, kWidenedStreamPrefetchBytes ahead: widening a line takes
// about as many instructions there); from the L1 buffer, not at all.
struct PairsFromWeights {
  const int8_t* wi;
  C10_ALWAYS_INLINE void prefetch(int64_t g) const {
    prefetch_ahead<kWidenedStreamPrefetchBytes>(wi + g * kGroupBytes);
  }
  C10_ALWAYS_INLINE __m512i operator()(int64_t g, int h) const {
    return group_pairs(wi + g * kGroupBytes, h);
  }
};
struct PairsFromBuffer {
  const c10::BFloat16* wb;
  C10_ALWAYS_INLINE void prefetch(int64_t) const {}
  C10_ALWAYS_INLINE __m512i operator()(int64_t g, int h) const {
    return _mm512_loadu_si512(wb + g * kGroupBytes + 32 * h);
  }
};

template <int R, typename Pairs>
C10_ALWAYS_INLINE void pair_tile(const c10::BFloat16* x, int64_t x_stride, Pairs pairs,
                                 int64_t groups, float* partial, bool first) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) {
    for (int h = 0; h < 2; ++h) {
      acc[r][h] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(partial + r * kGroupBytes + 16 * h);
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    pairs.prefetch(g);
    const __m512i w0 = pairs(g, 0);
    const __m512i w1 = pairs(g, 1);
    for (int r = 0; r < R; ++r) {
      long long four;
      std::memcpy(&four, x + r * x_stride + g * kGroupK, sizeof(four));
      const __m512i xv = _mm512_set1_epi64(four);
      acc[r][0] = dot_bf16_pairs(acc[r][0], w0, xv);
      acc[r][1] = dot_bf16_pairs(acc[r][1], w1, xv);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int h = 0; h < 2; ++h) {
      _mm512_storeu_ps(partial + r * kGroupBytes + 16 * h, acc[r][h]);
    }
  }
}

template <typename Pairs, int R = kPairTileRows>
void pair_tile_rows(int rows, const c10::BFloat16* x, int64_t x_stride, Pairs pairs, int64_t groups,
                    float* partial, bool first) {
  if constexpr (R > 1) {
    if (rows < R) {
      pair_tile_rows<Pairs, R - 1>(rows, x, x_stride, pairs, groups, partial, first);
      return;
    }
  }
  pair_tile<R>(x, x_stride, pairs, groups, partial, first);
}

// Widens `count` groups of int8 weights to the pairs PairsFromBuffer reads.
void widen_to_pairs(const int8_t* wi, int64_t count, c10::BFloat16* wb) {
  for (int64_t g = 0; g < count; ++g) {
    for (int h = 0; h < 2; ++h) {
      _mm512_storeu_si512(wb + g * kGroupBytes + 32 * h, group_pairs(wi + g * kGroupBytes, h));
    }
  }
}
#endif

template <typename scalar_t>
void weight_only_linear(const at::Tensor& out, const at::Tensor& input, const at::Tensor& packed,
                        const at::Tensor& scale, const at::Tensor& bias) {
  const int64_t m_total = input.size(0);
  const int64_t k = input.size(1);
  const int64_t n = scale.size(0);
  const int64_t blocks = packed.size(0);
  const int64_t groups = packed.size(1);
  const int64_t k_padded = groups * kGroupK;
  const scalar_t* in = input.const_data_ptr<scalar_t>();

  bool paired = false;
  // bfloat16 rows of whole groups for the paired path.
  std::vector<c10::BFloat16> padded;
  [[maybe_unused]] const c10::BFloat16* xb = nullptr;
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    paired = detail::weight_pairs() && kCpuHasAvx512Bf16;
    if (paired && k == k_padded) {
      xb = in;
    } else if (paired) {
      padded.assign(static_cast<size_t>(m_total * k_padded), c10::BFloat16(0.0f));
      for (int64_t m = 0; m < m_total; ++m) {
        std::memcpy(padded.data() + m * k_padded, in + m * k, sizeof(scalar_t) * k);
      }
      xb = padded.data();
    }
  }
#endif

  // Otherwise activations as float32 rows of whole groups (zeros past K),
  // unless they already are.
  std::vector<float> widened;
  const float* x = nullptr;
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (k == k_padded) {
      x = in;
    }
  }
  if (x == nullptr && !paired) {
    widened.assign(static_cast<size_t>(m_total * k_padded), 0.0f);
    at::parallel_for(0, m_total, row_grain(k), [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) {
        for (int64_t i = 0; i < k; ++i) {
          widened[m * k_padded + i] = static_cast<float>(in[m * k + i]);
        }
      }
    });
    x = widened.data();
  }

  const int8_t* w = packed.const_data_ptr<int8_t>();
  const float* s = scale.const_data_ptr<float>();
  const scalar_t* b = bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr;
  scalar_t* o = out.mutable_data_ptr<scalar_t>();
  const int64_t chunks = (m_total + kChunkRows - 1) / kChunkRows;

  at::parallel_for(0, blocks * chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> partial(static_cast<size_t>(kChunkRows * kGroupBytes));
    std::vector<float> widened_weights(static_cast<size_t>(kWidenGroups * kGroupBytes));
    std::vector<c10::BFloat16> pair_weights(paired ? kWidenGroups * kGroupBytes : 0);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t block = task / chunks;
      const int64_t m_begin = (task % chunks) * kChunkRows;
      const int64_t m_end = std::min(m_total, m_begin + kChunkRows);
      const int8_t* wi = w + block * groups * kGroupBytes;
      if (paired && m_end - m_begin <= kTileRows) {
#if defined(CPU_CAPABILITY_AVX512)
        pair_tile_rows(static_cast<int>(m_end - m_begin), xb + m_begin * k_padded, k_padded,
                       PairsFromWeights{wi}, groups, partial.data(), true);
#endif
      } else if (paired) {
#if defined(CPU_CAPABILITY_AVX512)
        for (int64_t g0 = 0; g0 < groups; g0 += kWidenGroups) {
          const int64_t count = std::min(kWidenGroups, groups - g0);
          widen_to_pairs(wi + g0 * kGroupBytes, count, pair_weights.data());
          for (int64_t m = m_begin; m < m_end; m += kPairTileRows) {
            pair_tile_rows(static_cast<int>(std::min<int64_t>(kPairTileRows, m_end - m)),
                           xb + m * k_padded + g0 * kGroupK, k_padded,
                           PairsFromBuffer{pair_weights.data()}, count,
                           partial.data() + (m - m_begin) * kGroupBytes, g0 == 0);
          }
        }
#endif
      } else if (m_end - m_begin <= kTileRows) {
        // One tile: the weights go from memory through registers once.
        tile_rows<false>(static_cast<int>(m_end - m_begin), x + m_begin * k_padded, k_padded, wi,
                         nullptr, groups, partial.data(), true);
      } else {
        // Several tiles share each widened slice of the weights from L1.
        for (int64_t g0 = 0; g0 < groups; g0 += kWidenGroups) {
          const int64_t count = std::min(kWidenGroups, groups - g0);
          for (int64_t i = 0; i < count * kGroupBytes; i += W) {
            load_int8_as_float(wi + g0 * kGroupBytes + i).store(widened_weights.data() + i);
          }
          for (int64_t m = m_begin; m < m_end; m += kTileRows) {
            tile_rows<true>(static_cast<int>(std::min<int64_t>(kTileRows, m_end - m)),
                            x + m * k_padded + g0 * kGroupK, k_padded, nullptr,
                            widened_weights.data(), count,
                            partial.data() + (m - m_begin) * kGroupBytes, g0 == 0);
          }
        }
      }
      // The four lanes of a channel summed, its scale applied once.
      const int64_t channels = std::min(kBlockN, n - block * kBlockN);
      for (int64_t m = m_begin; m < m_end; ++m) {
        const float* lanes = partial.data() + (m - m_begin) * kGroupBytes;
        for (int64_t c = 0; c < channels; ++c) {
          const int64_t ch = block * kBlockN + c;
          const float sum =
              paired ? lanes[2 * c] + lanes[2 * c + 1]
                     : (lanes[4 * c] + lanes[4 * c + 1]) + (lanes[4 * c + 2] + lanes[4 * c + 3]);
          // float64 outputs keep the scale product and the bias add in
          // float64; the others work in float32.
          using opmath_t = at::opmath_type<scalar_t>;
          opmath_t value = static_cast<opmath_t>(sum) * static_cast<opmath_t>(s[ch]);
          if (b != nullptr) {
            value += static_cast<opmath_t>(b[ch]);
          }
          o[m * n + ch] = static_cast<scalar_t>(value);
        }
      }
    }
  });
}

void int8_weight_only_linear_kernel_impl(const at::Tensor& out, const at::Tensor& input,
                                         const at::Tensor& packed, const at::Tensor& scale,
                                         const at::Tensor& bias) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::int8_weight_only_linear",
      [&] { weight_only_linear<scalar_t>(out, input, packed, scale, bias); });
}

// ---------------------------------------------------------------------------
// W8A8 dynamic (int8_dynamic_linear). The rows of x are quantized first,
// into an int8 buffer of whole groups (zeros past K, where the packed
// weights are 0 too), per activation block of 32 along K: each block of a
// row gets its own scale, absmax / 127, with quantize_per_token_int8's math
// within the block (llama.cpp's Q8_0 activations). One scale per row let a
// row's largest activation, often an outlier channel, set the step for all
// the others: +2.5-5.8% perplexity on real models, against +0.1-0.4% per
// block. Then each task (kDotBlocks blocks of 16 channels x a chunk of
// rows: the blocks feed every thread at decode sizes, the chunks at large
// M) sums, block by block, int8 x int8 products in int32, exactly, so every
// build and every path gives the same sums:
//  - AVX-512 with AVX512_VNNI: vpdpbusd multiplies unsigned by signed bytes
//    and adds each channel's four products to its int32 lane: one
//    instruction per row, block and group of 4; a tile of 6 rows x 2
//    blocks shares each weight load and each broadcast of 4 activations
//    and keeps both the activation block's int32 sums and the rows' float32
//    accumulators in registers (fold_tile_vnni). The activations are stored
//    shifted to unsigned (xq + 128, as xq ^ 0x80), so a block's sums carry
//    128 * colsum[block, n] extra, taken off before the fold. (Folding
//    through memory, as the other paths do, made a decode step of Gemma 3
//    270M's W8A8 model twice as slow as its W8A16 one.)
//  - AVX-512 without VNNI and AVX2: vpmaddubsw is not used: with unsigned
//    activations up to 255 its int16 pair sums (up to 2 * 255 * 128) would
//    saturate. Both operands are sign-extended to int16 instead (vpmovsxbw)
//    and vpmaddwd adds each pair of products into an int32 lane (at most
//    2 * 127 * 128, exact): lane 2c + p of a row holds channel c's pair p
//    (k mod 4 in {2p, 2p + 1}); the fold adds the two. These paths leave
//    each activation block's sums in a buffer (tiles of 12 rows x 2 blocks
//    with AVX-512, the tiles of a chunk reusing the block's slice of the
//    weights from L1), then fold them.
//  - DEFAULT: plain int32 loops.
// Each block's exact sums are folded into a float32 accumulator per row and
// channel, block after block: acc = fma(x_scale[m, block], float(sum), acc)
// (float(sum) is exact: |sum| <= 32 * 127 * 128 < 2^24). The epilogue:
// y = acc * scale[n] (+ bias), in float32 (float64 for float64 x, from the
// float32 acc). The same operations in the same order in every build.

// The paths without VNNI, with AVX-512: 2 blocks x 12 rows: 24
// accumulators, 2 weight vectors, 1 broadcast.
constexpr int kDotTileRows = per_build(12, 2, 1);
// int32 lanes of partial sums per row (the pair layout's 2 per channel).
constexpr int64_t kDotLanes = 2 * kBlockN;
// Rows per task, a multiple of the tile; every tile of a chunk runs over
// one activation block's slice of the weights (8 groups, 512 bytes a block
// of channels) while it sits in L1.
constexpr int64_t kDotChunkRows = std::max(4 * kDotTileRows, 16);
constexpr int64_t kDotSliceGroups = detail::kInt8ActivationBlockK / kGroupK;
// Blocks of channels per task.
constexpr int kDotBlocks = 2;

C10_ALWAYS_INLINE int32_t load_four(const int8_t* p) {
  int32_t four;
  std::memcpy(&four, p, sizeof(four));
  return four;
}

// The pair layout (AVX-512 without VNNI, AVX2) or one lane per channel
// (DEFAULT); signed activations.
template <int R>
C10_ALWAYS_INLINE void dot_tile_signed(const int8_t* x, int64_t x_stride, const int8_t* w,
                                       int64_t groups, int32_t* partial, bool first) {
#if defined(CPU_CAPABILITY_AVX512)
  __m512i acc[R][2];
  for (int r = 0; r < R; ++r) {
    for (int h = 0; h < 2; ++h) {
      acc[r][h] =
          first ? _mm512_setzero_si512() : _mm512_loadu_si512(partial + r * kDotLanes + 16 * h);
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    const int8_t* wg = w + g * kGroupBytes;
    prefetch_ahead(wg);
    const __m512i w0 =
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg)));
    const __m512i w1 =
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + 32)));
    for (int r = 0; r < R; ++r) {
      const __m512i xv =
          _mm512_cvtepi8_epi16(_mm256_set1_epi32(load_four(x + r * x_stride + g * kGroupK)));
      acc[r][0] = _mm512_add_epi32(acc[r][0], _mm512_madd_epi16(w0, xv));
      acc[r][1] = _mm512_add_epi32(acc[r][1], _mm512_madd_epi16(w1, xv));
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int h = 0; h < 2; ++h) {
      _mm512_storeu_si512(partial + r * kDotLanes + 16 * h, acc[r][h]);
    }
  }
#elif defined(CPU_CAPABILITY_AVX2)
  __m256i acc[R][4];
  for (int r = 0; r < R; ++r) {
    for (int q = 0; q < 4; ++q) {
      acc[r][q] = first ? _mm256_setzero_si256()
                        : _mm256_loadu_si256(
                              reinterpret_cast<const __m256i*>(partial + r * kDotLanes + 8 * q));
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    prefetch_ahead(w + g * kGroupBytes);
    __m256i wv[4];
    for (int q = 0; q < 4; ++q) {
      wv[q] = _mm256_cvtepi8_epi16(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + g * kGroupBytes + 16 * q)));
    }
    for (int r = 0; r < R; ++r) {
      const __m256i xv =
          _mm256_cvtepi8_epi16(_mm_set1_epi32(load_four(x + r * x_stride + g * kGroupK)));
      for (int q = 0; q < 4; ++q) {
        acc[r][q] = _mm256_add_epi32(acc[r][q], _mm256_madd_epi16(wv[q], xv));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int q = 0; q < 4; ++q) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(partial + r * kDotLanes + 8 * q), acc[r][q]);
    }
  }
#else
  for (int r = 0; r < R; ++r) {
    for (int64_t c = 0; c < kBlockN; ++c) {
      int32_t sum = first ? 0 : partial[r * kDotLanes + c];
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t j = 0; j < kGroupK; ++j) {
          sum += static_cast<int32_t>(x[r * x_stride + g * kGroupK + j]) *
                 static_cast<int32_t>(w[g * kGroupBytes + c * kGroupK + j]);
        }
      }
      partial[r * kDotLanes + c] = sum;
    }
  }
#endif
}

// `blocks` (1 or kDotBlocks) blocks of channels for `rows` in [1,
// kDotTileRows] rows, block by block: dot_tile_signed.
template <int R = kDotTileRows>
void dot_tile_rows(int rows, int blocks, const int8_t* x, int64_t x_stride, const int8_t* w,
                   int64_t w_stride, int64_t groups, int32_t* partial, int64_t block_stride,
                   bool first) {
  if constexpr (R > 1) {
    if (rows < R) {
      dot_tile_rows<R - 1>(rows, blocks, x, x_stride, w, w_stride, groups, partial, block_stride,
                           first);
      return;
    }
  }
  for (int j = 0; j < blocks; ++j) {
    dot_tile_signed<R>(x, x_stride, w + j * w_stride, groups, partial + j * block_stride, first);
  }
}

#if defined(CPU_CAPABILITY_AVX512)
// Rows of the VNNI path's fused tile: per (row, block of channels) an int32
// accumulator for the current activation block and a float32 one for the
// whole row: 2 blocks x 6 rows x 2 = 24 vectors, with 2 weight vectors, a
// broadcast, 2 column-sum shifts and a scale broadcast.
constexpr int kVnniFoldRows = 6;

// The VNNI path whole: for R rows and B blocks of channels (weights
// `w_stride` bytes apart, the first at channel ch0), every activation block
// summed with vpdpbusd in int32, corrected by 128 * colsum, and folded into
// float32 accumulators in registers (acc = fma(x_scale, float(sum), acc));
// stored to acc_out + j * acc_stride + r * kBlockN.
template <int R, int B>
C10_ALWAYS_INLINE void fold_tile_vnni(const int8_t* x, int64_t x_stride, const float* x_scale,
                                      int64_t x_scale_stride, const int8_t* w, int64_t w_stride,
                                      int64_t groups, int64_t activation_blocks,
                                      const int16_t* colsum, int64_t n, int64_t ch0, float* acc_out,
                                      int64_t acc_stride) {
  __m512 total[R][B];
  __mmask16 masks[B];
  for (int j = 0; j < B; ++j) {
    const int64_t channels = std::min<int64_t>(kBlockN, n - ch0 - j * kBlockN);
    masks[j] = static_cast<__mmask16>((1u << channels) - 1u);
    for (int r = 0; r < R; ++r) {
      total[r][j] = _mm512_setzero_ps();
    }
  }
  for (int64_t ab = 0; ab < activation_blocks; ++ab) {
    const int64_t g_begin = ab * kDotSliceGroups;
    const int64_t g_end = std::min(groups, g_begin + kDotSliceGroups);
    __m512i sums[R][B];
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < B; ++j) {
        sums[r][j] = _mm512_setzero_si512();
      }
    }
    for (int64_t g = g_begin; g < g_end; ++g) {
      __m512i wv[B];
      for (int j = 0; j < B; ++j) {
        // The float path's distance: at prefetch.h's 1 KiB a decode step's
        // weights from memory arrived late here too (Gemma 3 270M's head,
        // 32768 x 640 of it: about 650 us against 200-400 at 4 KiB; noisy).
        prefetch_ahead<kWidenedStreamPrefetchBytes>(w + j * w_stride + g * kGroupBytes);
        wv[j] = _mm512_loadu_si512(w + j * w_stride + g * kGroupBytes);
      }
      for (int r = 0; r < R; ++r) {
        const __m512i xv = _mm512_set1_epi32(load_four(x + r * x_stride + g * kGroupK));
        for (int j = 0; j < B; ++j) {
          sums[r][j] = dot_u8_s8(sums[r][j], xv, wv[j]);
        }
      }
    }
    __m512i shift[B];
    for (int j = 0; j < B; ++j) {
      const int16_t* cs = colsum + ab * n + ch0 + j * kBlockN;
      shift[j] =
          _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(masks[j], cs)), 7);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 xs = _mm512_set1_ps(x_scale[r * x_scale_stride + ab]);
      for (int j = 0; j < B; ++j) {
        const __m512 sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(sums[r][j], shift[j]));
        total[r][j] = _mm512_fmadd_ps(xs, sum, total[r][j]);
      }
    }
  }
  for (int j = 0; j < B; ++j) {
    for (int r = 0; r < R; ++r) {
      _mm512_storeu_ps(acc_out + j * acc_stride + r * kBlockN, total[r][j]);
    }
  }
}

// fold_tile_vnni for a run-time rows in [1, kVnniFoldRows] and blocks in
// [1, kDotBlocks].
template <int R = kVnniFoldRows>
void fold_tile_vnni_rows(int rows, int blocks, const int8_t* x, int64_t x_stride,
                         const float* x_scale, int64_t x_scale_stride, const int8_t* w,
                         int64_t w_stride, int64_t groups, int64_t activation_blocks,
                         const int16_t* colsum, int64_t n, int64_t ch0, float* acc_out,
                         int64_t acc_stride) {
  if constexpr (R > 1) {
    if (rows < R) {
      fold_tile_vnni_rows<R - 1>(rows, blocks, x, x_stride, x_scale, x_scale_stride, w, w_stride,
                                 groups, activation_blocks, colsum, n, ch0, acc_out, acc_stride);
      return;
    }
  }
  if (blocks == kDotBlocks) {
    fold_tile_vnni<R, kDotBlocks>(x, x_stride, x_scale, x_scale_stride, w, w_stride, groups,
                                  activation_blocks, colsum, n, ch0, acc_out, acc_stride);
  } else {
    fold_tile_vnni<R, 1>(x, x_stride, x_scale, x_scale_stride, w, w_stride, groups,
                         activation_blocks, colsum, n, ch0, acc_out, acc_stride);
  }
}
#endif

// The exact int32 sums of one activation block for `channels` channels of
// a block (lanes as dot_tile_rows leaves them), into sums[0, kBlockN): the
// pair lanes added (AVX-512 without VNNI, AVX2), DEFAULT's lanes as they
// are; 0 past `channels`.
C10_ALWAYS_INLINE void block_sums(const int32_t* lanes, int64_t channels, int32_t* sums) {
#if defined(CPU_CAPABILITY_AVX512)
  // Lane 2c + p of the two vectors: the even lanes and the odd ones.
  const __m512i low = _mm512_loadu_si512(lanes);
  const __m512i high = _mm512_loadu_si512(lanes + 16);
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  _mm512_storeu_si512(sums, _mm512_add_epi32(_mm512_permutex2var_epi32(low, even, high),
                                             _mm512_permutex2var_epi32(low, odd, high)));
#elif defined(CPU_CAPABILITY_AVX2)
  for (int h = 0; h < 2; ++h) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes + 16 * h));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes + 16 * h + 8));
    // hadd pairs within 128-bit halves: a01 a23 b01 b23 | a45 a67 b45 b67.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums + 8 * h),
                        _mm256_permute4x64_epi64(_mm256_hadd_epi32(a, b), 0xD8));
  }
#else
  for (int64_t c = 0; c < kBlockN; ++c) {
    sums[c] = lanes[c];
  }
#endif
  for (int64_t c = channels; c < kBlockN; ++c) {
    sums[c] = 0;
  }
}

template <typename scalar_t>
void dynamic_linear(const at::Tensor& out, const at::Tensor& input, const at::Tensor& packed,
                    const at::Tensor& scale, const at::Tensor& colsum, const at::Tensor& bias) {
  const int64_t m_total = input.size(0);
  const int64_t k = input.size(1);
  const int64_t n = scale.size(0);
  const int64_t blocks = packed.size(0);
  const int64_t groups = packed.size(1);
  const int64_t k_padded = groups * kGroupK;
  constexpr int64_t kActivationBlockK = detail::kInt8ActivationBlockK;
  const int64_t activation_blocks = (k + kActivationBlockK - 1) / kActivationBlockK;
#if defined(CPU_CAPABILITY_AVX512)
  const bool vnni = kUseAvx512Vnni;
#else
  const bool vnni = false;
#endif

  const scalar_t* in = input.const_data_ptr<scalar_t>();
  // Zeros past K: the packed weights there are 0, so any value adds 0. One
  // cache line more than the row between rows: with power-of-two K the rows
  // of a tile would otherwise share a few L1 sets and evict each other.
  const int64_t x_stride = k_padded + 64;
  std::vector<int8_t> xq(static_cast<size_t>(m_total * x_stride), 0);
  // x_scale[m * activation_blocks + b]: row m's block b.
  std::vector<float> x_scale(static_cast<size_t>(m_total * activation_blocks));
  at::parallel_for(0, m_total, row_grain(k), [&](int64_t begin, int64_t end) {
    std::vector<float> buffer;
    for (int64_t m = begin; m < end; ++m) {
      for (int64_t b = 0; b < activation_blocks; ++b) {
        const int64_t start = b * kActivationBlockK;
        // Inf or NaN in the block: its scale is NaN, so the row's outputs
        // come out NaN.
        x_scale[m * activation_blocks + b] =
            quantize_row_for_dot(in + m * k + start, std::min(kActivationBlockK, k - start),
                                 xq.data() + m * x_stride + start, vnni, buffer);
      }
    }
  });

  const int8_t* w = packed.const_data_ptr<int8_t>();
  const float* s = scale.const_data_ptr<float>();
  const scalar_t* b = bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr;
  scalar_t* o = out.mutable_data_ptr<scalar_t>();
  const int64_t chunks = (m_total + kDotChunkRows - 1) / kDotChunkRows;

  const int64_t units = (blocks + kDotBlocks - 1) / kDotBlocks;
  const int64_t block_bytes = groups * kGroupBytes;
  const int64_t block_stride = kDotChunkRows * kDotLanes;
  // The float32 accumulators: kBlockN per row of the chunk and block.
  const int64_t acc_stride = kDotChunkRows * kBlockN;
  at::parallel_for(0, units * chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> partial(static_cast<size_t>(kDotBlocks * block_stride));
    std::vector<float> acc(static_cast<size_t>(kDotBlocks * acc_stride));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t first_block = (task / chunks) * kDotBlocks;
      const int unit_blocks = static_cast<int>(std::min<int64_t>(kDotBlocks, blocks - first_block));
      const int64_t m_begin = (task % chunks) * kDotChunkRows;
      const int64_t m_end = std::min(m_total, m_begin + kDotChunkRows);
      const int8_t* wb = w + first_block * block_bytes;
#if defined(CPU_CAPABILITY_AVX512)
      if (vnni) {
        // The sums and the fold in registers, tile by tile.
        const int16_t* cs = colsum.const_data_ptr<int16_t>();
        for (int64_t m = m_begin; m < m_end; m += kVnniFoldRows) {
          const int rows = static_cast<int>(std::min<int64_t>(kVnniFoldRows, m_end - m));
          fold_tile_vnni_rows(rows, unit_blocks, xq.data() + m * x_stride, x_stride,
                              x_scale.data() + m * activation_blocks, activation_blocks, wb,
                              block_bytes, groups, activation_blocks, cs, n, first_block * kBlockN,
                              acc.data() + (m - m_begin) * kBlockN, acc_stride);
        }
      }
#endif
      // The other paths: each activation block's sums in `partial`, then
      // folded into the float32 accumulators.
      for (int64_t ab = 0; ab < (vnni ? 0 : activation_blocks); ++ab) {
        const int64_t g0 = ab * kDotSliceGroups;
        const int64_t count = std::min(kDotSliceGroups, groups - g0);
        for (int64_t m = m_begin; m < m_end; m += kDotTileRows) {
          const int rows = static_cast<int>(std::min<int64_t>(kDotTileRows, m_end - m));
          dot_tile_rows(rows, unit_blocks, xq.data() + m * x_stride + g0 * kGroupK, x_stride,
                        wb + g0 * kGroupBytes, block_bytes, count,
                        partial.data() + (m - m_begin) * kDotLanes, block_stride, /*first=*/true);
        }
        for (int j = 0; j < unit_blocks; ++j) {
          const int64_t channels = std::min(kBlockN, n - (first_block + j) * kBlockN);
          for (int64_t m = m_begin; m < m_end; ++m) {
            alignas(64) int32_t sums[kBlockN];
            block_sums(partial.data() + j * block_stride + (m - m_begin) * kDotLanes, channels,
                       sums);
            const FloatVec xs(x_scale[m * activation_blocks + ab]);
            float* am = acc.data() + j * acc_stride + (m - m_begin) * kBlockN;
            for (int64_t c = 0; c < kBlockN; c += W) {
              const FloatVec before = ab == 0 ? FloatVec(0.0f) : FloatVec::loadu(am + c);
              fused_multiply_add(xs, load_int32_as_float(sums + c), before).store(am + c);
            }
          }
        }
      }
      using opmath_t = at::opmath_type<scalar_t>;
      for (int j = 0; j < unit_blocks; ++j) {
        const int64_t ch0 = (first_block + j) * kBlockN;
        const int64_t channels = std::min(kBlockN, n - ch0);
        for (int64_t m = m_begin; m < m_end; ++m) {
          const float* am = acc.data() + j * acc_stride + (m - m_begin) * kBlockN;
          scalar_t* om = o + m * n + ch0;
          if constexpr (std::is_same_v<opmath_t, float>) {
            // The same operations lane by lane, so the same bits as the
            // scalar form, in every build.
            for (int64_t c = 0; c < channels; c += W) {
              const int64_t count = std::min(W, channels - c);
              FloatVec value = FloatVec::loadu(am + c, count) * FloatVec::loadu(s + ch0 + c, count);
              if (b != nullptr) {
                float bias_lanes[W];
                for (int64_t l = 0; l < count; ++l) {
                  bias_lanes[l] = static_cast<float>(b[ch0 + c + l]);
                }
                value = value + FloatVec::loadu(bias_lanes, count);
              }
              if constexpr (std::is_same_v<scalar_t, float>) {
                value.store(om + c, count);
              } else {
                narrow_from_float<scalar_t>(value, value).store(om + c, count);
              }
            }
          } else {
            for (int64_t c = 0; c < channels; ++c) {
              opmath_t value = static_cast<opmath_t>(am[c]) * static_cast<opmath_t>(s[ch0 + c]);
              if (b != nullptr) {
                value += static_cast<opmath_t>(b[ch0 + c]);
              }
              om[c] = static_cast<scalar_t>(value);
            }
          }
        }
      }
    }
  });
}

void int8_dynamic_linear_kernel_impl(const at::Tensor& out, const at::Tensor& input,
                                     const at::Tensor& packed, const at::Tensor& scale,
                                     const at::Tensor& colsum, const at::Tensor& bias) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::int8_dynamic_linear",
      [&] { dynamic_linear<scalar_t>(out, input, packed, scale, colsum, bias); });
}

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(Int8LinearCpuKernels::weight_only,
                            &int8_weight_only_linear_kernel_impl);
FUSEOPS_REGISTER_CPU_KERNEL(Int8LinearCpuKernels::dynamic, &int8_dynamic_linear_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
