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
// depend on the rows around it. The exception: bfloat16 activations on
// CPUs with AVX512_BF16 and without AMX-BF16 (detail::weight_pairs) take the
// vdpbf16ps path below at every row count (its sums differ from the float32
// path's by float32 rounding; a row still has the same bits whatever the
// batch), unless FUSEOPS_DISABLE_AVX512_BF16 is set.

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include "ops/common/reduced_gemms.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/int4_channels.h"
#include "ops_generated/cpu/int4_linear.h"
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
constexpr int kDirectRows = per_build(8, 2, 1);
constexpr int kTileRows = per_build(8, 3, 1);
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

// R rows' sums over one group (`dots`: each row's products summed, per
// vector of channels): less the zero points' share, scaled and added to
// `result` (R x 16 floats; `first`: start from 0).
//
// Every loop over rows and vectors here and in the tiles is unrolled in
// full: an accumulator array indexed in a loop lives in memory, and GCC
// then loads and stores it around every multiply-add of the hot loop (it did
// so for two rows: three times the time of one row).
template <int R>
C10_ALWAYS_INLINE void finish_group(const Group& group, const Accumulator (&dots)[R][V],
                                    float* result, bool first) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const FloatVec x_sum(group.sums[r * group.sums_stride]);
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
      const FloatVec dot = fused_multiply_add(group.neg_zero[v], x_sum, FloatVec(dots[r][v]));
      const FloatVec before =
          first ? FloatVec(0.0f) : FloatVec::loadu(result + r * kBlockN + v * W);
      fused_multiply_add(group.scale[v], dot, before).store(result + r * kBlockN + v * W);
    }
  }
}

// The even and odd accumulators of R rows added, then finish_group.
template <int R>
C10_ALWAYS_INLINE void finish_even_odd(const Group& group, Accumulator (&even)[R][V],
                                       const Accumulator (&odd)[R][V], float* result, bool first) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
      even[r][v] = FloatVec(even[r][v]) + FloatVec(odd[r][v]);
    }
  }
  finish_group<R>(group, even, result, first);
}

template <int R>
C10_ALWAYS_INLINE void zero_accumulators(Accumulator (&even)[R][V], Accumulator (&odd)[R][V]) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
      even[r][v] = FloatVec(0.0f);
      odd[r][v] = FloatVec(0.0f);
    }
  }
}

// Pair p's decoded weights (`we`: the even position's, `wo`: the odd one's)
// times R rows' activations (x rows `x_stride` floats apart, from the
// group's first position), added to the rows' even and odd sums.
template <int R>
C10_ALWAYS_INLINE void add_pair_to_rows(Accumulator (&even)[R][V], Accumulator (&odd)[R][V],
                                        const FloatVec (&we)[V], const FloatVec (&wo)[V],
                                        const float* x, int64_t x_stride, int64_t p) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const FloatVec xe(x[r * x_stride + 2 * p]);
    const FloatVec xo(x[r * x_stride + 2 * p + 1]);
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
      even[r][v] = fused_multiply_add(we[v], xe, FloatVec(even[r][v]));
      odd[r][v] = fused_multiply_add(wo[v], xo, FloatVec(odd[r][v]));
    }
  }
}

// R rows over one group of the block's packed weight `w`, decoded in
// registers.
template <int R>
C10_ALWAYS_INLINE void direct_tile(const float* x, int64_t x_stride, const uint8_t* w,
                                   const Group& group, float* result, bool first) {
  Accumulator even[R][V];
  Accumulator odd[R][V];
  zero_accumulators<R>(even, odd);
  for (int64_t p = 0; p < group.pairs; ++p) {
    if (p % 4 == 0) {
      prefetch_ahead(w + p * kBlockN);  // one 64-byte line per 4 pairs
    }
    FloatVec we[V];
    FloatVec wo[V];
    decode_pair(w + p * kBlockN, we, wo);
    add_pair_to_rows<R>(even, odd, we, wo, x, x_stride, p);
  }
  finish_even_odd<R>(group, even, odd, result, first);
}

// The same over a group already decoded into `decoded` (per position, 16
// floats: the channels' values q).
template <int R>
C10_ALWAYS_INLINE void buffered_tile(const float* x, int64_t x_stride, const float* decoded,
                                     const Group& group, float* result, bool first) {
  Accumulator even[R][V];
  Accumulator odd[R][V];
  zero_accumulators<R>(even, odd);
  for (int64_t p = 0; p < group.pairs; ++p) {
    FloatVec we[V];
    FloatVec wo[V];
    for (int v = 0; v < V; ++v) {
      we[v] = FloatVec::loadu(decoded + 2 * p * kBlockN + v * W);
      wo[v] = FloatVec::loadu(decoded + (2 * p + 1) * kBlockN + v * W);
    }
    add_pair_to_rows<R>(even, odd, we, wo, x, x_stride, p);
  }
  finish_even_odd<R>(group, even, odd, result, first);
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

#if defined(CPU_CAPABILITY_AVX512)
// bfloat16 activations on CPUs with AVX512_BF16 (every row count): each
// 16-byte row of the packed weight becomes 32 bfloat16 by a table lookup
// (vpermw; the values 0..15 are exact in bfloat16), lane 2c channel c's
// value at the even position, 2c + 1 at the odd one, and vdpbf16ps adds
// both products of a row's pair of activations (broadcast as one dword) to
// channel c's float32 lane: one instruction per row for 32 weights, where
// the float32 path takes two fused multiply-adds after four conversions.
// Each product is exact in float32 (8 by 4 significant bits); a lane adds
// the odd position's product, then the even one's, each add rounded, so the
// sums differ from the float32 path's (an even and an odd chain) by float32
// rounding, and the instruction treats bfloat16 and float32 denormals
// (below about 1.2e-38) as 0.
//
// The activations are arranged once per call as dwords (a pair of
// bfloat16) by tile of kPairTileRows rows: [tile][pair of K][row], so that a
// tile's broadcasts read one pointer at constant offsets; with a pointer per
// row, 12 rows spilled accumulators to the stack. Rows per tile: three
// accumulators for each of 8 rows (pair_tile's chains), beside the weights
// and the table, within the 32 vector registers.
constexpr int kPairTileRows = 8;
constexpr int kPairChains = 3;
static_assert(V == 1, "a block of 16 channels is one AVX-512 vector");
constexpr int64_t kPairChunkRows = 4 * kPairTileRows;

// vpermw's table: words q and q + 16 (q in 0..15) the bfloat16 of q, so
// that an index word's fifth bit does not matter (decode_pair_bf16).
__m512i bfloat16_of_nibbles() {
  alignas(64) uint16_t words[32] = {};
  for (int q = 0; q < 32; ++q) {
    words[q] = c10::BFloat16(static_cast<float>(q % 16)).x;
  }
  return _mm512_load_si512(words);
}

// A 16-byte row of the packed weight as 32 bfloat16: channel c's low nibble
// in word 2c, its high nibble in word 2c + 1. Three vector instructions,
// two of them shuffles: every 128-bit lane of the broadcast load holds the
// row, vpshufb gives both words of dword c byte c (twice: the word is
// byte c | byte c << 8), vpsrlvw shifts the odd words right by 4, and
// vpermw looks each word's low five bits up in the table: the low nibble
// plus a bit of the high one (even words), the high nibble plus a bit of
// byte c's copy (odd words), both read alike through the doubled table.
// One fewer instruction than a zero-extension, a shift and a mask (the
// decode is most of a one-row call's work): 106 -> 97 us for the row above.
C10_ALWAYS_INLINE __m512i decode_pair_bf16(const uint8_t* p, __m512i table) {
  const __m512i row = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  // Lane L holds channels 4L..4L + 3: dword i of the lane is byte 4L + i, 4 times.
  const __m512i spread = _mm512_shuffle_epi8(
      row, _mm512_set_epi32(0x0F0F0F0F, 0x0E0E0E0E, 0x0D0D0D0D, 0x0C0C0C0C, 0x0B0B0B0B, 0x0A0A0A0A,
                            0x09090909, 0x08080808, 0x07070707, 0x06060606, 0x05050505, 0x04040404,
                            0x03030303, 0x02020202, 0x01010101, 0x00000000));
  const __m512i nibbles = _mm512_srlv_epi16(spread, _mm512_set1_epi32(0x00040000));
  return _mm512_permutexvar_epi16(nibbles, table);
}

// Pair p of a group as 32 bfloat16: read from `decoded` (kBuffered: a
// chunk's tiles share the group decoded once), else decoded from `w`.
template <bool kBuffered>
C10_ALWAYS_INLINE __m512i pair_weights(const uint8_t* w, const c10::BFloat16* decoded,
                                       __m512i table, int64_t p) {
  if constexpr (kBuffered) {
    return _mm512_loadu_si512(decoded + 2 * p * kBlockN);
  } else {
    if (p % 4 == 0) {
      prefetch_ahead(w + p * kBlockN);  // one 64-byte line per 4 pairs
    }
    return decode_pair_bf16(w + p * kBlockN, table);
  }
}

// Chain C of R rows gains their products with pair p's weights `wv`; `x`:
// the tile's arranged activations from the group's first pair.
template <int R, int C>
C10_ALWAYS_INLINE void add_pair_products(__m512 (&acc)[R][kPairChains], __m512i wv,
                                         const int32_t* x, int64_t p) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    acc[r][C] = dot_bf16_pairs(acc[r][C], wv, x + p * kPairTileRows + r);
  }
}

// R rows of a tile over one group.
template <int R, bool kBuffered>
C10_ALWAYS_INLINE void pair_tile(const int32_t* x, const uint8_t* w, const c10::BFloat16* decoded,
                                 __m512i table, const Group& group, float* result, bool first) {
  // kPairChains chains per row: pair p of the group goes to chain p % 3, and
  // the chains add as (0 + 1) + 2. vdpbf16ps has the latency of several
  // additions: with one chain a one-row call ran at a third of the bytes'
  // speed; three instead of two took one row of 1024 x 2048 weights in
  // cache, one thread, from 110 to 106 us. The split is the same for every
  // row count, so a row's bits do not depend on the batch.
  __m512 acc[R][kPairChains];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int c = 0; c < kPairChains; ++c) {
      acc[r][c] = _mm512_setzero_ps();
    }
  }
  int64_t p = 0;
  for (; p + 2 < group.pairs; p += 3) {
    add_pair_products<R, 0>(acc, pair_weights<kBuffered>(w, decoded, table, p), x, p);
    add_pair_products<R, 1>(acc, pair_weights<kBuffered>(w, decoded, table, p + 1), x, p + 1);
    add_pair_products<R, 2>(acc, pair_weights<kBuffered>(w, decoded, table, p + 2), x, p + 2);
  }
  if (p < group.pairs) {
    add_pair_products<R, 0>(acc, pair_weights<kBuffered>(w, decoded, table, p), x, p);
  }
  if (p + 1 < group.pairs) {
    add_pair_products<R, 1>(acc, pair_weights<kBuffered>(w, decoded, table, p + 1), x, p + 1);
  }
  Accumulator dots[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    dots[r][0] = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), acc[r][2]);
  }
  finish_group<R>(group, dots, result, first);
}

template <bool kBuffered, int R = kPairTileRows>
void pair_tile_rows(int rows, const int32_t* x, const uint8_t* w, const c10::BFloat16* decoded,
                    __m512i table, const Group& group, float* result, bool first) {
  if constexpr (R > 1) {
    if (rows < R) {
      pair_tile_rows<kBuffered, R - 1>(rows, x, w, decoded, table, group, result, first);
      return;
    }
  }
  pair_tile<R, kBuffered>(x, w, decoded, table, group, result, first);
}
#endif

#if defined(CPU_CAPABILITY_AVX512)
constexpr int64_t kPairChunkRowsOrZero = kPairChunkRows;
#else
constexpr int64_t kPairChunkRowsOrZero = 0;
#endif

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
  // The pair path's activations, arranged (see kPairTileRows): tile t's
  // pair P of row r at (t * k_pairs + P) * kPairTileRows + r, zero past K.
  [[maybe_unused]] const int64_t k_pairs = k_padded / 2;
  [[maybe_unused]] thread_local std::vector<int32_t> reused_arranged;
  [[maybe_unused]] std::vector<int32_t> fresh_arranged;
  [[maybe_unused]] const int32_t* arranged = nullptr;
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    if (detail::weight_pairs() && kCpuHasAvx512Bf16) {
      const int64_t tiles = (m_total + kPairTileRows - 1) / kPairTileRows;
      const size_t dwords = static_cast<size_t>(tiles * k_pairs * kPairTileRows);
      std::vector<int32_t>& buffer =
          dwords <= kReusedActivationFloats ? reused_arranged : fresh_arranged;
      buffer.resize(std::max(buffer.size(), dwords));
      int32_t* a = buffer.data();
      at::parallel_for(0, m_total, row_grain(k), [&](int64_t begin, int64_t end) {
        for (int64_t m = begin; m < end; ++m) {
          int32_t* row = a + (m / kPairTileRows) * k_pairs * kPairTileRows + m % kPairTileRows;
          const uint16_t* bits = reinterpret_cast<const uint16_t*>(in + m * k);
          for (int64_t pair = 0; pair < k_pairs; ++pair) {
            const uint32_t even = 2 * pair < k ? bits[2 * pair] : 0;
            const uint32_t odd = 2 * pair + 1 < k ? bits[2 * pair + 1] : 0;
            row[pair * kPairTileRows] = static_cast<int32_t>(even | (odd << 16));
          }
        }
      });
      arranged = a;
    }
  }
#endif
  const bool paired = arranged != nullptr;

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
          const float value = static_cast<float>(in[m * k + i]);
          // The pair path's products take denormal activations as 0: so
          // does its zero points' share.
          widened[m * k_padded + i] =
              paired && std::fabs(value) < std::numeric_limits<float>::min() ? 0.0f : value;
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
  const ScaleZeroRows scale_zero_rows(scale_zero);
  const scalar_t* b = bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr;
  scalar_t* o = out.mutable_data_ptr<scalar_t>();
  const bool direct = paired || m_total <= kDirectRows;
  const int64_t chunk_rows = paired   ? std::min<int64_t>(m_total, kPairChunkRowsOrZero)
                             : direct ? m_total
                                      : kChunkRows;
  const int64_t chunks = (m_total + chunk_rows - 1) / chunk_rows;
  const int64_t pairs = group_size / 2;
  const int64_t block_bytes = packed.size(1) * kBlockN;

  at::parallel_for(0, blocks * chunks, 1, [&](int64_t begin, int64_t end) {
    float result[std::max({kChunkRows, int64_t{kDirectRows}, kPairChunkRowsOrZero}) * kBlockN];
    std::vector<float> decoded(direct ? 0 : static_cast<size_t>(group_size * kBlockN));
#if defined(CPU_CAPABILITY_AVX512)
    const __m512i table = bfloat16_of_nibbles();
    // The chunk's tiles share a group decoded once, when there are several.
    std::vector<c10::BFloat16> decoded_pairs(
        paired && chunk_rows > kPairTileRows ? 2 * pairs * kBlockN : 0);
#endif
    for (int64_t task = begin; task < end; ++task) {
      const auto [block, m_begin, m_end, channel0, channels] =
          Int4Task::of(task, chunks, chunk_rows, m_total, n);
      const uint8_t* wb = w + block * block_bytes;
      for (int64_t g = 0; g < groups; ++g) {
        Group group;
        group.pairs = pairs;
        group.sums_stride = groups;
        scale_zero_rows.load(g, channel0, channels, group.scale, group.neg_zero);
        const uint8_t* wg = wb + g * pairs * kBlockN;
        const float* xg = x + g * group_size;
#if defined(CPU_CAPABILITY_AVX512)
        if (paired) {
          const bool shared = !decoded_pairs.empty();
          if (shared) {
            for (int64_t p = 0; p < pairs; ++p) {
              _mm512_storeu_si512(decoded_pairs.data() + 2 * p * kBlockN,
                                  decode_pair_bf16(wg + p * kBlockN, table));
            }
          }
          for (int64_t m = m_begin; m < m_end; m += kPairTileRows) {
            group.sums = sums + m * groups + g;
            const int rows = static_cast<int>(std::min<int64_t>(kPairTileRows, m_end - m));
            const int32_t* xt =
                arranged + ((m / kPairTileRows) * k_pairs + g * pairs) * kPairTileRows;
            float* tile_result = result + (m - m_begin) * kBlockN;
            if (shared) {
              pair_tile_rows<true>(rows, xt, wg, decoded_pairs.data(), table, group, tile_result,
                                   g == 0);
            } else {
              pair_tile_rows<false>(rows, xt, wg, nullptr, table, group, tile_result, g == 0);
            }
          }
          continue;
        }
#endif
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
