#pragma once
// Vectorized loads/stores through the opmath type and the parallel loops of
// the elementwise kernels, for kernel files compiled per CPU capability.
//
// bfloat16/float16 are always widened to float32 before any arithmetic,
// comparison or blend. at::vec::map would not do that for a generic lambda
// where Vectorized<BFloat16>/<Half> are specialised (AVX2, AVX512), and
// under AVX-512 some of their operations are wrong: torch 2.13's
// Vectorized<Half>/<BFloat16> maximum loses NaN and changes neighbouring
// lanes. Float32 vectors have no such surprises, and a test pins down the
// special values of every kernel in every build.

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "ops/cpu/dispatch.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {

// Elements per parallel task: big enough that thread start-up is amortised.
inline constexpr int64_t kElementwiseGrain = 32768;
// The same for kernels that work row by row (the normalizations), whose
// elements each cost more.
inline constexpr int64_t kRowGrain = 16384;

// Rows of `row_elements` per parallel task of a row-wise kernel.
inline int64_t row_grain(int64_t row_elements) {
  return std::max<int64_t>(1, kRowGrain / std::max<int64_t>(row_elements, 1));
}

// Blocks of rows for a row-wise kernel that also sums over the rows (the
// norms' weight gradients): each block sums its rows on its own, then the
// blocks' partial sums are added in block order. The count depends on the
// rows alone, never on the thread count, so the sums have the same bits
// whatever torch.set_num_threads says. A block holds at least four tasks'
// worth of rows, so adding the partials costs at most a quarter of a row per
// row summed; 64 blocks keep up to 64 threads busy for a partial-sum buffer
// of 64 rows.
inline int64_t row_sum_blocks(int64_t rows, int64_t row_elements) {
  constexpr int64_t kMaxBlocks = 64;
  const int64_t rows_per_block = 4 * row_grain(row_elements);
  return std::clamp<int64_t>((rows + rows_per_block - 1) / rows_per_block, 1, kMaxBlocks);
}

// A constant chosen per CPU build, most often a register tile's size: the
// AVX-512 build's (32 vector registers), the AVX2 build's (16), the DEFAULT
// build's.
template <typename T>
constexpr T per_build(T avx512, T avx2, T fallback) {
#if defined(CPU_CAPABILITY_AVX512)
  return avx512;
#elif defined(CPU_CAPABILITY_AVX2)
  return avx2;
#else
  return fallback;
#endif
}

#if defined(CPU_CAPABILITY_AVX512)
// AVX512_BF16 (Zen 4, Cooper Lake, Sapphire Rapids and later) rounds 32
// floats to bfloat16 in one instruction; ATen's portable conversion takes
// about twenty (measured with the AVX-512 exp below, 2M elements in cache,
// one thread: silu bfloat16 forward 583 -> 375 us, relu 165 -> 88 us).
// Read once; the branch on it is always predicted. FUSEOPS_DISABLE_AVX512_BF16
// set and not "0" turns these paths off on a CPU that has them: a test
// switch, so that the AVX-512 paths without AVX512_BF16 run there too.
inline const bool kCpuHasAvx512Bf16 =
    (__builtin_cpu_init(), __builtin_cpu_supports("avx512bf16")) &&
    !disabled_by_test_switch("FUSEOPS_DISABLE_AVX512_BF16");

// vdpbf16ps, for CPUs with AVX512_BF16: lane i of acc gains a[2i] * b[2i] +
// a[2i + 1] * b[2i + 1], the bfloat16 products exact in float32, each add
// rounded (the odd product first). It treats bfloat16 and float32
// denormals (below about 1.2e-38) as 0. The compiler is not told about
// AVX512_BF16 (see narrow_from_float below), hence asm.
C10_ALWAYS_INLINE __m512 dot_bf16_pairs(__m512 acc, __m512i a, __m512i b) {
  asm("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// The same with b the pair at `pair` in every lane, read by the instruction
// itself (an embedded broadcast): no separate broadcast per product, which
// at one row of activations is a sixth of a product's instructions.
C10_ALWAYS_INLINE __m512 dot_bf16_pairs(__m512 acc, __m512i a, const int32_t* pair) {
  asm("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*pair));
  return acc;
}
#endif

// Replaces every NaN of a bfloat16/float16 vector by the one quiet NaN
// c10's scalar conversion writes (bfloat16 0x7fc0, float16 0x7e00). The
// conversions differ in the NaN they write (ATen's AVX2/AVX-512 ones 0xffff,
// vcvtne2ps2bf16 and float16's vcvtps2ph the input's sign and payload), and
// a NaN's sign can depend on which lane computed it: one encoding makes a
// reduced output's bits independent of the build path, the thread count and
// the position of an element in its vector. Three instructions a vector.
template <typename scalar_t>
C10_ALWAYS_INLINE at::vec::Vectorized<scalar_t> canonical_nan(
    const at::vec::Vectorized<scalar_t>& v) {
  constexpr bool kBf16 = std::is_same_v<scalar_t, c10::BFloat16>;
  constexpr int16_t kInf = kBf16 ? 0x7f80 : 0x7c00;
  constexpr int16_t kNaN = kBf16 ? 0x7fc0 : 0x7e00;
#if defined(CPU_CAPABILITY_AVX512)
  const __m512i bits = v;
  const __mmask32 nan = _mm512_cmpgt_epi16_mask(_mm512_and_si512(bits, _mm512_set1_epi16(0x7fff)),
                                                _mm512_set1_epi16(kInf));
  return _mm512_mask_mov_epi16(bits, nan, _mm512_set1_epi16(kNaN));
#elif defined(CPU_CAPABILITY_AVX2)
  const __m256i bits = v;
  const __m256i nan = _mm256_cmpgt_epi16(_mm256_and_si256(bits, _mm256_set1_epi16(0x7fff)),
                                         _mm256_set1_epi16(kInf));
  return _mm256_blendv_epi8(bits, _mm256_set1_epi16(kNaN), nan);
#else
  using Vec = at::vec::Vectorized<scalar_t>;
  std::array<scalar_t, Vec::size()> lanes;
  v.store(lanes.data());
  for (auto& lane : lanes) {
    if ((lane.x & 0x7fff) > kInf) {
      lane.x = kNaN;
    }
  }
  return Vec::loadu(lanes.data());
#endif
}

// Rounds two float vectors to one vector of bfloat16/float16 (to nearest,
// ties to even; every NaN to canonical_nan's). kFinite: the caller knows
// there is no NaN (widened int8 weights), and skips the NaN pass.
template <typename scalar_t, bool kFinite = false>
C10_ALWAYS_INLINE at::vec::Vectorized<scalar_t> narrow_from_float(
    const at::vec::Vectorized<float>& lo, const at::vec::Vectorized<float>& hi) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    if (kCpuHasAvx512Bf16) {
      // vcvtne2ps2bf16 (AT&T order: low half from the first operand). The
      // compiler is not told about AVX512_BF16 (-mavx512bf16 would let it
      // emit such instructions anywhere in this build), hence the asm. The
      // instruction flushes float32 denormals (below 1.2e-38) to zero.
      __m512i packed;
      asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(packed) : "v"(__m512(hi)), "v"(__m512(lo)));
      if constexpr (kFinite) {
        return packed;
      } else {
        return canonical_nan<scalar_t>(packed);
      }
    }
  }
#endif
  const auto narrowed = at::vec::convert_from_float<scalar_t>(lo, hi);
  if constexpr (kFinite) {
    return narrowed;
  } else {
    return canonical_nan<scalar_t>(narrowed);
  }
}

// The block loads/stores below are C10_ALWAYS_INLINE: in the kernels' many
// dispatch instantiations GCC otherwise kept them as out-of-line calls, one
// per vector, passing registers through memory (measured: silu on 2M floats
// 3.1 ms with the calls, 1.9 ms inlined).

// Loads and stores the opmath registers (float for bfloat16/float16,
// float32 and float64 as themselves) from/to `count` consecutive scalar_t;
// lanes past `count` read as zeros and are not written.
template <typename scalar_t>
struct OpmathBlock {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = at::vec::Vectorized<opmath_t>;
  using ScalarVec = at::vec::Vectorized<scalar_t>;
  static constexpr bool kReduced = !std::is_same_v<scalar_t, opmath_t>;
  // One Vectorized<scalar_t> of a reduced type holds two opmath registers.
  static constexpr int kRegisters = kReduced ? 2 : 1;
  using Registers = std::array<Vec, kRegisters>;
  static constexpr int64_t kSize = ScalarVec::size();

  C10_ALWAYS_INLINE static Registers load(const scalar_t* p, int64_t count = kSize) {
    const ScalarVec raw = count == kSize ? ScalarVec::loadu(p) : ScalarVec::loadu(p, count);
    if constexpr (kReduced) {
      const auto [lo, hi] = at::vec::convert_to_float<scalar_t>(raw);
      return {lo, hi};
    } else {
      return {raw};
    }
  }

  C10_ALWAYS_INLINE static void store(scalar_t* p, const Registers& v, int64_t count = kSize) {
    if constexpr (kReduced) {
      narrow_from_float<scalar_t>(v[0], v[1]).store(p, count);
    } else {
      v[0].store(p, count);
    }
  }
};

// Calls fn(offset, count) for consecutive blocks covering [0, n): full
// blocks, then one partial block for the tail.
template <int64_t kBlock, typename Fn>
inline void for_each_block(int64_t n, const Fn& fn) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    fn(i, kBlock);
  }
  if (i < n) {
    fn(i, n - i);
  }
}

// Calls fn(offset, count) for blocks of kBlock elements covering [0, n),
// split across threads.
template <int64_t kBlock, typename Fn>
inline void parallel_blocks(int64_t n, const Fn& fn) {
  at::parallel_for(0, n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    for_each_block<kBlock>(end - begin, [&](int64_t i, int64_t count) { fn(begin + i, count); });
  });
}

// Calls fn(row, col_begin, col_end) for the parts of rows x cols (row-major)
// each parallel task owns; tasks split the flat range, so short rows are
// batched and long rows are shared.
template <typename Fn>
inline void parallel_rows(int64_t rows, int64_t cols, int64_t grain, const Fn& fn) {
  at::parallel_for(0, rows * cols, grain, [&](int64_t begin, int64_t end) {
    int64_t row = begin / cols;
    int64_t col = begin % cols;
    while (begin < end) {
      const int64_t stop = std::min(cols, col + (end - begin));
      fn(row, col, stop);
      begin += stop - col;
      ++row;
      col = 0;
    }
  });
}

// out[i] = op(in[i]) over n contiguous elements; `op` takes and returns a
// Vectorized<opmath_t> (float for bfloat16/float16).
template <typename scalar_t, typename VecOp>
void parallel_map(const VecOp& op, scalar_t* out, const scalar_t* in, int64_t n) {
  using Block = OpmathBlock<scalar_t>;
  parallel_blocks<Block::kSize>(n, [&](int64_t i, int64_t count) {
    auto x = Block::load(in + i, count);
    for (auto& v : x) {
      v = op(v);
    }
    Block::store(out + i, x, count);
  });
}

// out[i] = op(a[i], b[i]), as parallel_map.
template <typename scalar_t, typename VecOp>
void parallel_map2(const VecOp& op, scalar_t* out, const scalar_t* a, const scalar_t* b,
                   int64_t n) {
  using Block = OpmathBlock<scalar_t>;
  parallel_blocks<Block::kSize>(n, [&](int64_t i, int64_t count) {
    auto x = Block::load(a + i, count);
    const auto y = Block::load(b + i, count);
    for (int r = 0; r < Block::kRegisters; ++r) {
      x[r] = op(x[r], y[r]);
    }
    Block::store(out + i, x, count);
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
