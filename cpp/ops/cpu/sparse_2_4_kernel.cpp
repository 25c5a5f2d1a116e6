// 2:4 sparse linear CPU kernels; compiled once per CPU capability.
//
// The packed weight (cpp/include/fuseops/sparse_2_4.h) is streamed row by
// row: for each vector of W consecutive input features of a channel, its
// W/2 kept values are loaded, widened to float32 (int8, bfloat16 and
// float16 in registers) and expanded to their W positions, zeros
// elsewhere, by the channel's bitmask:
//  - AVX-512 (W = 16): the mask of 16 features is 2 bytes of meta, and
//    vexpandps places the 8 widened values (always exactly 8 are read, so
//    a malformed mask cannot read past the values); int8 values on CPUs
//    with AVX512_VBMI2 are expanded 64 at a time by vpexpandb (below);
//  - AVX2 (W = 8): one meta byte indexes a table of vpermps permutations
//    and lane masks (16 KiB, in L1);
//  - DEFAULT: lane by lane.
// The expanded vector is multiplied by the activations (float32, rows
// zero-padded to whole vectors) with multiply-adds (fused in the AVX
// builds); a register tile
// of 4 channels x kTileRows rows shares each expanded weight vector across
// its rows and each activation vector across its channels, and each lane
// sums its own features over K before the lanes are added and the
// channel's scale applied once. The weight bytes read are half of the
// dense weight's plus 1/8 byte per weight of mask, which is what bounds
// decoding (few rows); the multiply-adds are those of the dense weight.
//
// Work is split over (block of 16 channels) x (chunk of rows) tasks: at
// decode sizes the blocks alone feed every thread, each streaming its
// share of the weight once; a chunk's row tiles reuse a tile of channels'
// values from L1.
//
// float64 activations (with float64 or int8 values) are summed in float64
// by a plain loop, the same in every build (float64 is for checking, not
// for speed).
//
// The W8A8 op (sparse_2_4_dynamic_linear, int8 activations) has its own
// section below.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "ops/cpu/elementwise.h"
#include "ops/cpu/int8_vec.h"
#include "ops/cpu/quantize_row.h"
#include "ops_generated/cpu/sparse_2_4.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

constexpr int64_t W = FloatVec::size();
// Kept values and meta bytes per vector of W input features.
constexpr int64_t kKept = W / 2;
constexpr int64_t kMetaBytes = W / 8;
// Channels per register tile, and rows: kTileCh * kTileRows accumulators,
// kTileCh weight vectors and one activation vector within the register
// file (32 vectors with AVX-512, 16 otherwise).
constexpr int kTileCh = 4;
constexpr int kTileRows = per_build(4, 2, 1);
constexpr int64_t kBlockN = 16;
constexpr int64_t kChunkRows = 8 * kTileRows;
// Input features per vpexpandb (and vpdpbusd) step of the int8 paths.
constexpr int64_t kDotStep = 64;

#if defined(CPU_CAPABILITY_AVX2)
// For each meta byte (8 input features): lane l takes kept value idx[l]
// when mask[l] is all ones.
struct ExpandTable {
  alignas(32) int32_t idx[256][8];
  alignas(32) int32_t mask[256][8];
};

const ExpandTable& expand_table() {
  static const ExpandTable table = [] {
    ExpandTable t{};
    for (int b = 0; b < 256; ++b) {
      int next = 0;
      for (int l = 0; l < 8; ++l) {
        const bool kept = (b >> l) & 1;
        t.idx[b][l] = kept ? std::min(next++, 7) : 0;
        t.mask[b][l] = kept ? -1 : 0;
      }
    }
    return t;
  }();
  return table;
}
#endif

#if defined(CPU_CAPABILITY_AVX512)
// 8 values widened to float32.
template <typename value_t>
C10_ALWAYS_INLINE __m256 widen_kept(const value_t* v) {
  if constexpr (std::is_same_v<value_t, float>) {
    return _mm256_loadu_ps(v);
  } else if constexpr (std::is_same_v<value_t, c10::BFloat16>) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  } else if constexpr (std::is_same_v<value_t, c10::Half>) {
    // The AVX-512 form: this build is not given F16C.
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v));
    return _mm512_castps512_ps256(_mm512_cvtph_ps(_mm256_zextsi128_si256(raw)));
  } else {
    static_assert(std::is_same_v<value_t, int8_t>);
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(v))));
  }
}
#elif defined(CPU_CAPABILITY_AVX2)
// 4 values widened to float32.
template <typename value_t>
C10_ALWAYS_INLINE __m128 widen_kept(const value_t* v) {
  if constexpr (std::is_same_v<value_t, float>) {
    return _mm_loadu_ps(v);
  } else if constexpr (std::is_same_v<value_t, c10::BFloat16>) {
    const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v));
    return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(raw), 16));
  } else if constexpr (std::is_same_v<value_t, c10::Half>) {
    return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(v)));
  } else {
    static_assert(std::is_same_v<value_t, int8_t>);
    int32_t four;
    std::memcpy(&four, v, sizeof(four));
    return _mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(four)));
  }
}
#endif

// The dense weights of W input features from their kKept kept values `v`
// and kMetaBytes bytes of mask `mb`.
template <typename value_t>
C10_ALWAYS_INLINE FloatVec expand(const value_t* v, const uint8_t* mb) {
#if defined(CPU_CAPABILITY_AVX512)
  uint16_t mask;
  std::memcpy(&mask, mb, sizeof(mask));
  return _mm512_maskz_expand_ps(mask, _mm512_castps256_ps512(widen_kept(v)));
#elif defined(CPU_CAPABILITY_AVX2)
  const ExpandTable& table = expand_table();
  const __m256i idx = _mm256_load_si256(reinterpret_cast<const __m256i*>(table.idx[*mb]));
  const __m256 lanes =
      _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(table.mask[*mb])));
  const __m256 wide = _mm256_castps128_ps256(widen_kept(v));
  return _mm256_and_ps(_mm256_permutevar8x32_ps(wide, idx), lanes);
#else
  float lanes[W] = {};
  int64_t next = 0;
  for (int64_t l = 0; l < W; ++l) {
    if ((mb[l / 8] >> (l % 8)) & 1) {
      lanes[l] = static_cast<float>(v[std::min(next++, kKept - 1)]);
    }
  }
  return FloatVec::loadu(lanes);
#endif
}

// Calls step(w, offset) with the kTileCh channels' dense weights `w` of the
// W input features from `offset`, vector `first` to the end of k (a
// multiple of 4); expand(values, mask) makes one channel's vector (the float
// tile's and the int8 word tile's loop). The last features (fewer than W)
// are expanded from zero-padded copies of their values and mask, so nothing
// past the row is read.
template <typename Vec, typename value_t, typename Expand, typename Step>
C10_ALWAYS_INLINE void expanded_steps(const value_t* const* v, const uint8_t* const* mb, int64_t k,
                                      int64_t first, const Expand& expand, const Step& step) {
  const int64_t full = k / W;
  for (int64_t i = first; i < full; ++i) {
    Vec w[kTileCh];
    for (int c = 0; c < kTileCh; ++c) {
      w[c] = expand(v[c] + i * kKept, mb[c] + i * kMetaBytes);
    }
    step(w, i * W);
  }
  if (const int64_t tail = k - full * W; tail > 0) {
    Vec w[kTileCh];
    for (int c = 0; c < kTileCh; ++c) {
      value_t kept[kKept] = {};
      uint8_t mask[kMetaBytes] = {};
      std::memcpy(kept, v[c] + full * kKept, sizeof(value_t) * static_cast<size_t>(tail / 2));
      std::memcpy(mask, mb[c] + full * kMetaBytes, static_cast<size_t>((tail + 7) / 8));
      w[c] = expand(kept, mask);
    }
    step(w, full * W);
  }
}

#if defined(CPU_CAPABILITY_AVX512)
// int8 values on CPUs with AVX512_VBMI2: vpexpandb places 32 kept bytes in
// 64 positions at once, a quarter of the expand instructions of
// vexpandps (which issues one 16-lane expand every other cycle on the
// CPUs measured, the bound of a decoding row). The 64 int8 weights are
// then widened 16 at a time, as the dense int8 kernels do. The expanded
// weights and the order of every lane's sum are the same as the
// vexpandps path's, so both give the same bits. Read once; the branch on
// it is always predicted.
inline const bool kCpuHasAvx512Vbmi2 =
    (__builtin_cpu_init(), __builtin_cpu_supports("avx512vbmi2"));
constexpr int64_t kWideLanes = 64;

C10_ALWAYS_INLINE __m512i expand_bytes(const int8_t* v, const uint8_t* mb) {
  __mmask64 mask;
  std::memcpy(&mask, mb, sizeof(mask));
  const __m512i kept =
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v)));
  __m512i out;
  // The compiler is not told about AVX512_VBMI2 (the build must run on
  // AVX-512 CPUs without it), hence asm.
  asm("vpexpandb %1, %0%{%2%}%{z%}" : "=v"(out) : "v"(kept), "Yk"(mask));
  return out;
}
#endif

// The next register tile's weight bytes, for the int8 paths that expand
// kDotStep input features per step: its values and meta (contiguous,
// `value_bytes` and `meta_bytes` long; none when `values` is null). See
// dot_tile_vnni for why a step prefetches its share of them.
struct NextTile {
  const int8_t* values = nullptr;
  const uint8_t* meta = nullptr;
  int64_t value_bytes = 0;
  int64_t meta_bytes = 0;
};

#if defined(CPU_CAPABILITY_AVX512)
template <int C>
C10_ALWAYS_INLINE void prefetch_step(const NextTile& next, int64_t i) {
  if (next.values == nullptr) {
    return;
  }
  constexpr int64_t kValueShare = C * kDotStep / 2;
  constexpr int64_t kMetaShare = C * kDotStep / 8;
  for (int64_t off = i * kValueShare; off < std::min((i + 1) * kValueShare, next.value_bytes);
       off += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(next.values + off), _MM_HINT_T0);
  }
  if (i * kMetaShare < next.meta_bytes) {
    _mm_prefetch(reinterpret_cast<const char*>(next.meta + i * kMetaShare), _MM_HINT_T0);
  }
}
#endif

// sums[c * R + r] = sum_k x[r][k] * weight[c][k] for R rows (x rows
// `x_stride` floats apart, zero-padded to whole vectors) and kTileCh
// channels (values `v[c]`, meta `mb[c]`), over k input features; `wide`:
// the vpexpandb path for int8 values (AVX-512 with VBMI2), which prefetches
// `next` as dot_tile_vnni does (its reads are the same short streams).
template <int R, typename value_t>
C10_ALWAYS_INLINE void tile(const float* x, int64_t x_stride, const value_t* const* v,
                            const uint8_t* const* mb, int64_t k, float* sums, bool wide,
                            const NextTile& next) {
  FloatVec acc[kTileCh][R];
  for (int c = 0; c < kTileCh; ++c) {
    for (int r = 0; r < R; ++r) {
      acc[c][r] = FloatVec(0.0f);
    }
  }
  const auto step = [&](const FloatVec(&w)[kTileCh], int64_t offset) {
    for (int r = 0; r < R; ++r) {
      const FloatVec xv = FloatVec::loadu(x + r * x_stride + offset);
      for (int c = 0; c < kTileCh; ++c) {
        acc[c][r] = at::vec::fmadd(w[c], xv, acc[c][r]);
      }
    }
  };
  int64_t first = 0;
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<value_t, int8_t>) {
    if (wide) {
      static_assert(kWideLanes == kDotStep);
      const int64_t chunks = k / kWideLanes;
      for (int64_t i = 0; i < chunks; ++i) {
        prefetch_step<kTileCh>(next, i);
        __m512i bytes[kTileCh];
        for (int c = 0; c < kTileCh; ++c) {
          bytes[c] = expand_bytes(v[c] + i * kWideLanes / 2, mb[c] + i * kWideLanes / 8);
        }
        // The quarter index is an instruction immediate: a template
        // argument, so that it is a constant without optimisation too.
        static_assert(kWideLanes / W == 4);
        const auto quarter = [&](auto q) {
          constexpr int kQuarter = decltype(q)::value;
          FloatVec w[kTileCh];
          for (int c = 0; c < kTileCh; ++c) {
            w[c] = _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(bytes[c], kQuarter)));
          }
          step(w, i * kWideLanes + kQuarter * W);
        };
        quarter(std::integral_constant<int, 0>{});
        quarter(std::integral_constant<int, 1>{});
        quarter(std::integral_constant<int, 2>{});
        quarter(std::integral_constant<int, 3>{});
      }
      first = chunks * (kWideLanes / W);
    }
  }
#endif
  expanded_steps<FloatVec>(
      v, mb, k, first, [](const value_t* kept, const uint8_t* mask) { return expand(kept, mask); },
      step);
  for (int c = 0; c < kTileCh; ++c) {
    for (int r = 0; r < R; ++r) {
      sums[c * R + r] = at::vec::vec_reduce_all<float>(
          [](const FloatVec& a, const FloatVec& b) { return a + b; }, acc[c][r]);
    }
  }
}

// tile<rows> for a run-time rows in [1, kTileRows].
template <typename value_t, int R = kTileRows>
void tile_rows(int rows, const float* x, int64_t x_stride, const value_t* const* v,
               const uint8_t* const* mb, int64_t k, float* sums, bool wide, const NextTile& next) {
  if constexpr (R > 1) {
    if (rows < R) {
      tile_rows<value_t, R - 1>(rows, x, x_stride, v, mb, k, sums, wide, next);
      return;
    }
  }
  tile<R>(x, x_stride, v, mb, k, sums, wide, next);
}

// The output in parallel tasks of kBlockN channels by kChunkRows rows, and
// each task in register tiles of kTileCh channels by up to `tile_rows` rows:
// `tile(v, mb, c0, channels, m, rows, first)` with the tile's channels'
// values and mask rows, `first` on the task's first row tile (whose pass
// over the weights may prefetch the next tile's). A partial tile repeats its
// last channel; the caller drops those sums (c >= channels).
template <typename value_t, typename Tile>
void for_each_tile(const value_t* vals, int64_t v_stride, const uint8_t* masks, int64_t meta_stride,
                   int64_t n, int64_t m_total, int64_t tile_rows, const Tile& tile) {
  const int64_t blocks = (n + kBlockN - 1) / kBlockN;
  const int64_t chunks = (m_total + kChunkRows - 1) / kChunkRows;
  at::parallel_for(0, blocks * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t ch_begin = (task / chunks) * kBlockN;
      const int64_t ch_end = std::min(n, ch_begin + kBlockN);
      const int64_t m_begin = (task % chunks) * kChunkRows;
      const int64_t m_end = std::min(m_total, m_begin + kChunkRows);
      for (int64_t c0 = ch_begin; c0 < ch_end; c0 += kTileCh) {
        const int channels = static_cast<int>(std::min<int64_t>(kTileCh, ch_end - c0));
        const value_t* v[kTileCh];
        const uint8_t* mb[kTileCh];
        for (int c = 0; c < kTileCh; ++c) {
          const int64_t ch = c0 + std::min(c, channels - 1);
          v[c] = vals + ch * v_stride;
          mb[c] = masks + ch * meta_stride;
        }
        for (int64_t m = m_begin; m < m_end; m += tile_rows) {
          const int rows = static_cast<int>(std::min<int64_t>(tile_rows, m_end - m));
          tile(v, mb, c0, channels, m, rows, m == m_begin);
        }
      }
    }
  });
}

template <typename scalar_t, typename value_t>
void sparse_linear(const at::Tensor& out, const at::Tensor& input, const at::Tensor& values,
                   const at::Tensor& meta, const at::Tensor& scale, const at::Tensor& bias) {
  const int64_t m_total = input.size(0);
  const int64_t k = input.size(1);
  const int64_t n = values.size(0);
  const int64_t v_stride = values.size(1);
  const int64_t meta_stride = meta.size(1);
  const scalar_t* in = input.const_data_ptr<scalar_t>();

  // Activations as float32 rows of whole vectors (zeros past K), unless
  // they already are.
  const float* x = nullptr;
  int64_t x_stride = k;
  std::vector<float> widened;
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (k % W == 0) {
      x = in;
    }
  }
  if (x == nullptr) {
    x_stride = (k + W - 1) / W * W;
    widened.assign(static_cast<size_t>(m_total * x_stride), 0.0f);
    at::parallel_for(0, m_total, row_grain(k), [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) {
        for (int64_t i = 0; i < k; ++i) {
          widened[m * x_stride + i] = static_cast<float>(in[m * k + i]);
        }
      }
    });
    x = widened.data();
  }

  const value_t* vals = values.const_data_ptr<value_t>();
  const uint8_t* masks = meta.const_data_ptr<uint8_t>();
  const float* s = scale.const_data_ptr<float>();
  const scalar_t* b = bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr;
  scalar_t* o = out.mutable_data_ptr<scalar_t>();
  using opmath_t = at::opmath_type<scalar_t>;
#if defined(CPU_CAPABILITY_AVX512)
  const bool wide = std::is_same_v<value_t, int8_t> && kCpuHasAvx512Vbmi2;
#else
  const bool wide = false;
#endif

  for_each_tile(vals, v_stride, masks, meta_stride, n, m_total, kTileRows,
                [&](const value_t* const* v, const uint8_t* const* mb, int64_t c0, int channels,
                    int64_t m, int rows, bool first) {
                  float sums[kTileCh * kTileRows];
                  // The next tile's bytes, on the first row tile's pass only.
                  NextTile next;
                  if constexpr (std::is_same_v<value_t, int8_t>) {
                    if (wide && first && c0 + kTileCh < n) {
                      const int64_t next_channels = std::min<int64_t>(kTileCh, n - c0 - kTileCh);
                      next = {vals + (c0 + kTileCh) * v_stride,
                              masks + (c0 + kTileCh) * meta_stride, next_channels * v_stride,
                              next_channels * meta_stride};
                    }
                  }
                  tile_rows<value_t>(rows, x + m * x_stride, x_stride, v, mb, k, sums, wide, next);
                  for (int c = 0; c < channels; ++c) {
                    const int64_t ch = c0 + c;
                    for (int r = 0; r < rows; ++r) {
                      opmath_t value =
                          static_cast<opmath_t>(sums[c * rows + r]) * static_cast<opmath_t>(s[ch]);
                      if (b != nullptr) {
                        value += static_cast<opmath_t>(b[ch]);
                      }
                      o[(m + r) * n + ch] = static_cast<scalar_t>(value);
                    }
                  }
                });
}

// float64 activations (float64 or int8 values): float64 sums, one output
// at a time, the same in every build.
template <typename value_t>
void sparse_linear_double(const at::Tensor& out, const at::Tensor& input, const at::Tensor& values,
                          const at::Tensor& meta, const at::Tensor& scale, const at::Tensor& bias) {
  const int64_t m_total = input.size(0);
  const int64_t k = input.size(1);
  const int64_t n = values.size(0);
  const int64_t v_stride = values.size(1);
  const int64_t meta_stride = meta.size(1);
  const double* x = input.const_data_ptr<double>();
  const value_t* vals = values.const_data_ptr<value_t>();
  const uint8_t* masks = meta.const_data_ptr<uint8_t>();
  const float* s = scale.const_data_ptr<float>();
  const double* b = bias.defined() ? bias.const_data_ptr<double>() : nullptr;
  double* o = out.mutable_data_ptr<double>();
  at::parallel_for(0, n, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, m_total * k / 8)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t ch = begin; ch < end; ++ch) {
                       const value_t* v = vals + ch * v_stride;
                       const uint8_t* mb = masks + ch * meta_stride;
                       for (int64_t m = 0; m < m_total; ++m) {
                         const double* xm = x + m * k;
                         double sum = 0.0;
                         int64_t next = 0;
                         for (int64_t i = 0; i < k && next < v_stride; ++i) {
                           if ((mb[i / 8] >> (i % 8)) & 1) {
                             sum += xm[i] * static_cast<double>(v[next++]);
                           }
                         }
                         double value = sum * static_cast<double>(s[ch]);
                         if (b != nullptr) {
                           value += b[ch];
                         }
                         o[m * n + ch] = value;
                       }
                     }
                   });
}

void sparse_2_4_linear_kernel_impl(const at::Tensor& out, const at::Tensor& input,
                                   const at::Tensor& values, const at::Tensor& meta,
                                   const at::Tensor& scale, const at::Tensor& bias) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::sparse_2_4_linear", [&] {
        if constexpr (std::is_same_v<scalar_t, double>) {
          if (values.scalar_type() == at::kChar) {
            sparse_linear_double<int8_t>(out, input, values, meta, scale, bias);
          } else {
            sparse_linear_double<double>(out, input, values, meta, scale, bias);
          }
        } else if (values.scalar_type() == at::kChar) {
          sparse_linear<scalar_t, int8_t>(out, input, values, meta, scale, bias);
        } else {
          sparse_linear<scalar_t, scalar_t>(out, input, values, meta, scale, bias);
        }
      });
}

// ---------------------------------------------------------------------------
// W8A8 dynamic (sparse_2_4_dynamic_linear): int8 x int8 products with the
// packed 2:4 int8 weight, one activation scale per row (int8_dynamic_linear
// has one per block of 32). The rows of x are quantized first, by the
// same row quantizer (quantize_row.h), into int8 rows zero-padded past K;
// then each task (a block of 16 channels x a chunk of rows, as above) sums
// the int8 products of the kept weights in int32, exactly, so every build
// and every path give the same sums:
//  - AVX-512 with AVX512_VNNI and AVX512_VBMI2: vpexpandb places a
//    channel's 32 kept values of 64 input features (expand_bytes, above)
//    and vpdpbusd multiplies them by the 64 activations of a row, stored
//    shifted to unsigned (xq + 128, as xq ^ 0x80): one expand per channel
//    and 64 features, one multiply-add per row and channel of a tile of 4
//    channels x up to 6 rows, the next tile's weight bytes prefetched
//    (dot_tile_vnni). The sums carry 128 * colsum[n]
//    extra, taken off at the end (modulo 2^32: the lanes wrap, and the true
//    sum fits in int32, see kMaxDynamicK).
//  - other AVX-512 CPUs, and AVX2: the kept values are sign-extended to
//    int32 lanes and expanded as the float path places them (vpexpandd by
//    the 16-bit mask; AVX2: the permutation table), and vpmaddwd multiplies
//    them by the activations stored one per int32 lane (the int16 in the
//    low half, 0 in the high one): each lane's product, exact.
//  - DEFAULT: plain int32 loops.
// The weight bytes read are those of the W8A16 path: half the dense int8
// weight's plus the mask. The epilogue: y =
// (float(acc) * x_scale[m]) * scale[n] (+ bias), in float32 (float64 for
// float64 x), rounded to x's dtype.

enum class DotPath { kVnni, kWords, kScalar };

// Rows of the VNNI path's tiles (of kTileCh channels): 24 accumulators, 4
// weight vectors, an activation vector.
constexpr int kVnniTileRows = 6;

// Quantized rows hold whole steps, and one step more: with power-of-two K
// the rows of a tile would otherwise share a few L1 sets and evict each
// other.
C10_ALWAYS_INLINE int64_t quantized_row_stride(int64_t k) {
  return (k + kDotStep - 1) / kDotStep * kDotStep + kDotStep;
}

// f(std::integral_constant<int, rows>) for a run-time rows in [1, R].
template <int R = kTileRows, typename F>
C10_ALWAYS_INLINE void for_rows(int rows, const F& f) {
  if constexpr (R > 1) {
    if (rows < R) {
      for_rows<R - 1>(rows, f);
      return;
    }
  }
  f(std::integral_constant<int, R>{});
}

#if defined(CPU_CAPABILITY_AVX512)
// sums[c * R + r] = sum_k (xq[r][k] + 128) * weight[c][k] (modulo 2^32) for
// R rows of shifted activations (`x_stride` bytes apart, whole steps) and C
// channels (values `v[c]`, meta `mb[c]`) over k input features. Each
// expanded weight vector feeds R rows and each activation vector C
// channels; with few of both, U accumulators per pair (consecutive steps)
// hide vpdpbusd's latency.
//
// The tile's channels are adjacent rows of values and meta, but read side
// by side they are 2C short streams (one 4 KiB page each at K = 8192),
// which the hardware prefetchers follow badly: half the bandwidth of one
// stream on the CPU measured. So each step also prefetches its share of
// the next tile's values and meta (`next`: contiguous, `value_bytes` and
// `meta_bytes` long; none when `values` is null), which turns the reads of
// a block into one stream ahead of the multiply-adds.
template <int C, int R>
C10_ALWAYS_INLINE void dot_tile_vnni(const int8_t* x, int64_t x_stride, const int8_t* const* v,
                                     const uint8_t* const* mb, int64_t k, const NextTile& next,
                                     int32_t* sums) {
  constexpr int U = C * R >= 4 ? 1 : 4 / (C * R);
  __m512i acc[U][C][R];
  for (int u = 0; u < U; ++u) {
    for (int c = 0; c < C; ++c) {
      for (int r = 0; r < R; ++r) {
        acc[u][c][r] = _mm512_setzero_si512();
      }
    }
  }
  static_assert(kWideLanes == kDotStep);
  const int64_t full = k / kDotStep;
  // The tail (the last features, a multiple of 4, fewer than 64): its
  // values and mask copied into a zero-padded step's worth, so nothing past
  // the row is read. The activations past K are 0 (unshifted), so whatever
  // a mask places there adds 0.
  const int64_t tail = k - full * kDotStep;
  int8_t tail_kept[C][kDotStep / 2] = {};
  uint8_t tail_mask[C][kDotStep / 8] = {};
  if (tail > 0) {
    for (int c = 0; c < C; ++c) {
      std::memcpy(tail_kept[c], v[c] + full * kDotStep / 2, static_cast<size_t>(tail / 2));
      std::memcpy(tail_mask[c], mb[c] + full * kDotStep / 8, static_cast<size_t>((tail + 7) / 8));
    }
  }
  const int64_t steps = full + (tail > 0 ? 1 : 0);
  int64_t i = 0;
  for (; i + U <= full; i += U) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      prefetch_step<C>(next, i + u);
      __m512i w[C];
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        w[c] = expand_bytes(v[c] + (i + u) * kDotStep / 2, mb[c] + (i + u) * kDotStep / 8);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i xv = _mm512_loadu_si512(x + r * x_stride + (i + u) * kDotStep);
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
          acc[u][c][r] = dot_u8_s8(acc[u][c][r], xv, w[c]);
        }
      }
    }
  }
  for (; i < steps; ++i) {
    prefetch_step<C>(next, i);
    __m512i w[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      w[c] = i < full ? expand_bytes(v[c] + i * kDotStep / 2, mb[c] + i * kDotStep / 8)
                      : expand_bytes(tail_kept[c], tail_mask[c]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i xv = _mm512_loadu_si512(x + r * x_stride + i * kDotStep);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        acc[0][c][r] = dot_u8_s8(acc[0][c][r], xv, w[c]);
      }
    }
  }
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) {
      __m512i sum = acc[0][c][r];
      for (int u = 1; u < U; ++u) {
        sum = _mm512_add_epi32(sum, acc[u][c][r]);
      }
      sums[c * R + r] = _mm512_reduce_add_epi32(sum);
    }
  }
}
#endif

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#if defined(CPU_CAPABILITY_AVX512)
using IntVec = __m512i;
#else
using IntVec = __m256i;
#endif

// The W int8 weights of W input features, sign-extended to int32 lanes,
// from their kKept kept values `v` and kMetaBytes bytes of mask `mb` (the
// float path's expand, on integers).
C10_ALWAYS_INLINE IntVec expand_words(const int8_t* v, const uint8_t* mb) {
#if defined(CPU_CAPABILITY_AVX512)
  uint16_t mask;
  std::memcpy(&mask, mb, sizeof(mask));
  return _mm512_maskz_expand_epi32(
      mask, _mm512_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(v))));
#else
  const ExpandTable& table = expand_table();
  const __m256i idx = _mm256_load_si256(reinterpret_cast<const __m256i*>(table.idx[*mb]));
  const __m256i lanes = _mm256_load_si256(reinterpret_cast<const __m256i*>(table.mask[*mb]));
  int32_t four;
  std::memcpy(&four, v, sizeof(four));
  const __m256i wide = _mm256_cvtepi8_epi32(_mm_cvtsi32_si128(four));
  return _mm256_and_si256(_mm256_permutevar8x32_epi32(wide, idx), lanes);
#endif
}

C10_ALWAYS_INLINE IntVec load_words(const int32_t* p) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_loadu_si512(p);
#else
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
#endif
}

// acc + each int32 lane's product (vpmaddwd: the high halves of `x` are 0).
C10_ALWAYS_INLINE IntVec multiply_add_words(IntVec acc, IntVec w, IntVec x) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_add_epi32(acc, _mm512_madd_epi16(w, x));
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(w, x));
#endif
}

C10_ALWAYS_INLINE int32_t sum_words(IntVec v) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_reduce_add_epi32(v);
#else
  int32_t lanes[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), v);
  int32_t sum = 0;
  for (int32_t lane : lanes) {
    sum += lane;
  }
  return sum;
#endif
}

// sums[c * R + r] = sum_k xq[r][k] * weight[c][k] for R rows of activations
// as int32 words (`x_stride` words apart, whole vectors, zeros past K) and
// kTileCh channels over k input features.
template <int R>
C10_ALWAYS_INLINE void dot_tile_words(const int32_t* x, int64_t x_stride, const int8_t* const* v,
                                      const uint8_t* const* mb, int64_t k, int32_t* sums) {
  IntVec acc[kTileCh][R];
  for (int c = 0; c < kTileCh; ++c) {
    for (int r = 0; r < R; ++r) {
      acc[c][r] = IntVec{};
    }
  }
  const auto step = [&](const IntVec(&w)[kTileCh], int64_t offset) {
    for (int r = 0; r < R; ++r) {
      const IntVec xv = load_words(x + r * x_stride + offset);
      for (int c = 0; c < kTileCh; ++c) {
        acc[c][r] = multiply_add_words(acc[c][r], w[c], xv);
      }
    }
  };
  expanded_steps<IntVec>(
      v, mb, k, 0, [](const int8_t* kept, const uint8_t* mask) { return expand_words(kept, mask); },
      step);
  for (int c = 0; c < kTileCh; ++c) {
    for (int r = 0; r < R; ++r) {
      sums[c * R + r] = sum_words(acc[c][r]);
    }
  }
}
#endif

// The DEFAULT build: sums[c * R + r] for R rows of int8 activations, output
// by output.
template <int R>
void dot_tile_scalar(const int8_t* x, int64_t x_stride, const int8_t* const* v,
                     const uint8_t* const* mb, int64_t k, int64_t v_stride, int32_t* sums) {
  for (int c = 0; c < kTileCh; ++c) {
    for (int r = 0; r < R; ++r) {
      const int8_t* xr = x + r * x_stride;
      int32_t sum = 0;
      int64_t next = 0;
      for (int64_t i = 0; i < k && next < v_stride; ++i) {
        if ((mb[c][i / 8] >> (i % 8)) & 1) {
          sum += static_cast<int32_t>(xr[i]) * static_cast<int32_t>(v[c][next++]);
        }
      }
      sums[c * R + r] = sum;
    }
  }
}

template <typename scalar_t>
void sparse_dynamic_linear(const at::Tensor& out, const at::Tensor& input, const at::Tensor& values,
                           const at::Tensor& meta, const at::Tensor& scale,
                           const at::Tensor& colsum, const at::Tensor& bias) {
  const int64_t m_total = input.size(0);
  const int64_t k = input.size(1);
  const int64_t n = values.size(0);
  const int64_t v_stride = values.size(1);
  const int64_t meta_stride = meta.size(1);
#if defined(CPU_CAPABILITY_AVX512)
  const DotPath path = kUseAvx512Vnni && kCpuHasAvx512Vbmi2 ? DotPath::kVnni : DotPath::kWords;
#elif defined(CPU_CAPABILITY_AVX2)
  const DotPath path = DotPath::kWords;
#else
  const DotPath path = DotPath::kScalar;
#endif

  // Quantized rows of whole steps, zeros past K (unshifted: they add 0
  // whatever the mask places there); for the word path, the same as int32
  // words (the int16 in the low half).
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  const int64_t q_stride = quantized_row_stride(k);
  // 64-byte aligned: the VNNI path loads whole cache lines of it.
  std::vector<int8_t> xq_buffer(static_cast<size_t>(m_total * q_stride + kDotStep), 0);
  int8_t* const xq = xq_buffer.data() + (-reinterpret_cast<uintptr_t>(xq_buffer.data()) % kDotStep);
  std::vector<int32_t> xw(path == DotPath::kWords ? static_cast<size_t>(m_total * q_stride) : 0, 0);
  std::vector<float> x_scale(static_cast<size_t>(m_total));
  at::parallel_for(0, m_total, row_grain(k), [&](int64_t begin, int64_t end) {
    std::vector<float> buffer;
    for (int64_t m = begin; m < end; ++m) {
      int8_t* q = xq + m * q_stride;
      x_scale[m] = quantize_row_for_dot(in + m * k, k, q, path == DotPath::kVnni, buffer);
      if (path == DotPath::kWords) {
        for (int64_t i = 0; i < k; ++i) {
          xw[m * q_stride + i] = static_cast<uint16_t>(static_cast<int16_t>(q[i]));
        }
      }
    }
  });

  const int8_t* vals = values.const_data_ptr<int8_t>();
  const uint8_t* masks = meta.const_data_ptr<uint8_t>();
  const float* s = scale.const_data_ptr<float>();
  const int32_t* cs = colsum.const_data_ptr<int32_t>();
  const scalar_t* b = bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr;
  scalar_t* o = out.mutable_data_ptr<scalar_t>();
  using opmath_t = at::opmath_type<scalar_t>;

  // Output (row m, channel ch) from its int32 sum.
  const auto emit = [&](int64_t m, int64_t ch, int32_t acc) {
    if (path == DotPath::kVnni) {
      // Modulo 2^32, as the lanes wrapped; the true sum fits.
      acc = static_cast<int32_t>(static_cast<uint32_t>(acc) - 128u * static_cast<uint32_t>(cs[ch]));
    }
    opmath_t value = (static_cast<opmath_t>(acc) * static_cast<opmath_t>(x_scale[m])) *
                     static_cast<opmath_t>(s[ch]);
    if (b != nullptr) {
      value += static_cast<opmath_t>(b[ch]);
    }
    o[m * n + ch] = static_cast<scalar_t>(value);
  };

  const int64_t tile_rows = path == DotPath::kVnni ? kVnniTileRows : kTileRows;
  for_each_tile(vals, v_stride, masks, meta_stride, n, m_total, tile_rows,
                [&](const int8_t* const* v, const uint8_t* const* mb, int64_t c0, int channels,
                    int64_t m, int rows, bool first) {
                  int32_t sums[kTileCh * std::max(kTileRows, kVnniTileRows)];
#if defined(CPU_CAPABILITY_AVX512)
                  if (path == DotPath::kVnni) {
                    // The next tile's bytes, on the first row tile's pass only.
                    NextTile next;
                    if (first && c0 + kTileCh < n) {
                      const int64_t next_channels = std::min<int64_t>(kTileCh, n - c0 - kTileCh);
                      next = {vals + (c0 + kTileCh) * v_stride,
                              masks + (c0 + kTileCh) * meta_stride, next_channels * v_stride,
                              next_channels * meta_stride};
                    }
                    for_rows<kVnniTileRows>(rows, [&](auto r) {
                      dot_tile_vnni<kTileCh, decltype(r)::value>(xq + m * q_stride, q_stride, v, mb,
                                                                 k, next, sums);
                    });
                  }
#else
    (void)first;
#endif
                  if (path != DotPath::kVnni) {
                    for_rows(rows, [&](auto r) {
                      constexpr int R = decltype(r)::value;
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
                      dot_tile_words<R>(xw.data() + m * q_stride, q_stride, v, mb, k, sums);
#else
        dot_tile_scalar<R>(xq + m * q_stride, q_stride, v, mb, k, v_stride, sums);
#endif
                    });
                  }
                  for (int c = 0; c < channels; ++c) {
                    for (int r = 0; r < rows; ++r) {
                      emit(m + r, c0 + c, sums[c * rows + r]);
                    }
                  }
                });
}

void sparse_2_4_dynamic_linear_kernel_impl(const at::Tensor& out, const at::Tensor& input,
                                           const at::Tensor& values, const at::Tensor& meta,
                                           const at::Tensor& scale, const at::Tensor& colsum,
                                           const at::Tensor& bias) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::sparse_2_4_dynamic_linear",
      [&] { sparse_dynamic_linear<scalar_t>(out, input, values, meta, scale, colsum, bias); });
}

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(Sparse24CpuKernels::linear, &sparse_2_4_linear_kernel_impl);
FUSEOPS_REGISTER_CPU_KERNEL(Sparse24CpuKernels::dynamic, &sparse_2_4_dynamic_linear_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
