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
#include "ops/cpu/sparse_2_4.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

using FloatVec = at::vec::Vectorized<float>;
constexpr int64_t W = FloatVec::size();
// Kept values and meta bytes per vector of W input features.
constexpr int64_t kKept = W / 2;
constexpr int64_t kMetaBytes = W / 8;
// Channels per register tile, and rows: kTileCh * kTileRows accumulators,
// kTileCh weight vectors and one activation vector within the register
// file (32 vectors with AVX-512, 16 otherwise).
constexpr int kTileCh = 4;
#if defined(CPU_CAPABILITY_AVX512)
constexpr int kTileRows = 4;
#elif defined(CPU_CAPABILITY_AVX2)
constexpr int kTileRows = 2;
#else
constexpr int kTileRows = 1;
#endif
constexpr int64_t kBlockN = 16;
constexpr int64_t kChunkRows = 8 * kTileRows;

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
  const __m256 lanes = _mm256_castsi256_ps(
      _mm256_load_si256(reinterpret_cast<const __m256i*>(table.mask[*mb])));
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

// sums[c * R + r] = sum_k x[r][k] * weight[c][k] for R rows (x rows
// `x_stride` floats apart, zero-padded to whole vectors) and kTileCh
// channels (values `v[c]`, meta `mb[c]`), over k input features; `wide`:
// the vpexpandb path for int8 values (AVX-512 with VBMI2).
template <int R, typename value_t>
C10_ALWAYS_INLINE void tile(const float* x, int64_t x_stride, const value_t* const* v,
                            const uint8_t* const* mb, int64_t k, float* sums, bool wide) {
  FloatVec acc[kTileCh][R];
  for (int c = 0; c < kTileCh; ++c) {
    for (int r = 0; r < R; ++r) {
      acc[c][r] = FloatVec(0.0f);
    }
  }
  const auto step = [&](const FloatVec (&w)[kTileCh], int64_t offset) {
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
      const int64_t chunks = k / kWideLanes;
      for (int64_t i = 0; i < chunks; ++i) {
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
  const int64_t full = k / W;
  for (int64_t i = first; i < full; ++i) {
    FloatVec w[kTileCh];
    for (int c = 0; c < kTileCh; ++c) {
      w[c] = expand(v[c] + i * kKept, mb[c] + i * kMetaBytes);
    }
    step(w, i * W);
  }
  if (const int64_t tail = k - full * W; tail > 0) {
    // The last features (a multiple of 4, fewer than W): their values and
    // mask copied into zero-padded vectors' worth, so nothing past the
    // row is read.
    FloatVec w[kTileCh];
    for (int c = 0; c < kTileCh; ++c) {
      value_t kept[kKept] = {};
      uint8_t mask[kMetaBytes] = {};
      std::memcpy(kept, v[c] + full * kKept, sizeof(value_t) * (tail / 2));
      std::memcpy(mask, mb[c] + full * kMetaBytes, (tail + 7) / 8);
      w[c] = expand(kept, mask);
    }
    step(w, full * W);
  }
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
               const uint8_t* const* mb, int64_t k, float* sums, bool wide) {
  if constexpr (R > 1) {
    if (rows < R) {
      tile_rows<value_t, R - 1>(rows, x, x_stride, v, mb, k, sums, wide);
      return;
    }
  }
  tile<R>(x, x_stride, v, mb, k, sums, wide);
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
  const int64_t blocks = (n + kBlockN - 1) / kBlockN;
  const int64_t chunks = (m_total + kChunkRows - 1) / kChunkRows;
  using opmath_t = at::opmath_type<scalar_t>;
#if defined(CPU_CAPABILITY_AVX512)
  const bool wide = std::is_same_v<value_t, int8_t> && kCpuHasAvx512Vbmi2;
#else
  const bool wide = false;
#endif

  at::parallel_for(0, blocks * chunks, 1, [&](int64_t begin, int64_t end) {
    float sums[kTileCh * kTileRows];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t ch_begin = (task / chunks) * kBlockN;
      const int64_t ch_end = std::min(n, ch_begin + kBlockN);
      const int64_t m_begin = (task % chunks) * kChunkRows;
      const int64_t m_end = std::min(m_total, m_begin + kChunkRows);
      for (int64_t c0 = ch_begin; c0 < ch_end; c0 += kTileCh) {
        const int channels = static_cast<int>(std::min<int64_t>(kTileCh, ch_end - c0));
        // A partial tile repeats its last channel; those sums are dropped.
        const value_t* v[kTileCh];
        const uint8_t* mb[kTileCh];
        for (int c = 0; c < kTileCh; ++c) {
          const int64_t ch = c0 + std::min(c, channels - 1);
          v[c] = vals + ch * v_stride;
          mb[c] = masks + ch * meta_stride;
        }
        for (int64_t m = m_begin; m < m_end; m += kTileRows) {
          const int rows = static_cast<int>(std::min<int64_t>(kTileRows, m_end - m));
          tile_rows<value_t>(rows, x + m * x_stride, x_stride, v, mb, k, sums, wide);
          for (int c = 0; c < channels; ++c) {
            const int64_t ch = c0 + c;
            for (int r = 0; r < rows; ++r) {
              opmath_t value = static_cast<opmath_t>(sums[c * rows + r]) *
                               static_cast<opmath_t>(s[ch]);
              if (b != nullptr) {
                value += static_cast<opmath_t>(b[ch]);
              }
              o[(m + r) * n + ch] = static_cast<scalar_t>(value);
            }
          }
        }
      }
    }
  });
}

// float64 activations (float64 or int8 values): float64 sums, one output
// at a time, the same in every build.
template <typename value_t>
void sparse_linear_double(const at::Tensor& out, const at::Tensor& input,
                          const at::Tensor& values, const at::Tensor& meta,
                          const at::Tensor& scale, const at::Tensor& bias) {
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

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(sparse_2_4_linear_kernel, &sparse_2_4_linear_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
