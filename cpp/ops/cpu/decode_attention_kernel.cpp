// decode_attention CPU kernel; compiled once per CPU capability
// (FuseopsCpuKernels.cmake).
//
// Work is cut by key/value head: the G query heads of one key/value head
// (times the L query positions) are one block of rows, so each key and value
// row is read from memory once for all of them, where SDPA with
// repeat_kv reads it G times. A decode step has B * Hkv such blocks, fewer
// than the threads on many machines, so the keys are also cut into chunks
// (flash-decoding; the split depends on the shapes only): each task keeps
// its chunk's running max, sum and weighted values, and a second pass
// merges the chunks of a row. Scores, softmax and sums are float32 (float64
// for float64 inputs).
//
// At one new token a block has G rows (4 for a 16/4-head model), so each
// key or value element carries G multiply-adds: the kernel is bound by its
// instructions per key, not by the arithmetic. On AVX2 and AVX-512 the
// scores put keys in lanes (one shuffle tree sums a vector of keys' dot
// products, where a horizontal sum each took about ten instructions), and
// the values are widened in registers as the sums read them.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "ops/cpu/elementwise.h"
#include "ops_generated/cpu/decode_attention.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

using at::vec::Vectorized;

// Query rows handled together: their scores of one key chunk stay in L1/L2.
constexpr int64_t kRowBlock = 16;
// Fewest keys per chunk when the keys are split across threads.
constexpr int64_t kMinChunk = 256;
// Tasks a call is cut into at the least (keys split) where enough keys: a
// constant, so that the split does not depend on the machine's threads.
constexpr int64_t kParallelTasks = 32;
// Keys whose rows are widened and used together (in L1/L2).
constexpr int64_t kKeyBlock = 32;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename acc_t>
acc_t dot(const acc_t* a, const acc_t* b, int64_t n) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  Vec s0(0);
  Vec s1(0);
  int64_t d = 0;
  for (; d + 2 * V <= n; d += 2 * V) {
    s0 = at::vec::fmadd(Vec::loadu(a + d), Vec::loadu(b + d), s0);
    s1 = at::vec::fmadd(Vec::loadu(a + d + V), Vec::loadu(b + d + V), s1);
  }
  if (d + V <= n) {
    s0 = at::vec::fmadd(Vec::loadu(a + d), Vec::loadu(b + d), s0);
    d += V;
  }
  acc_t sum = at::vec::vec_reduce_all<acc_t>([](Vec& x, Vec& y) { return x + y; }, s0 + s1);
  for (; d < n; ++d) {
    sum += a[d] * b[d];
  }
  return sum;
}

// acc[0, n) += p * v[0, n)
template <typename acc_t>
void axpy(acc_t* acc, acc_t p, const acc_t* v, int64_t n) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  const Vec pv(p);
  int64_t d = 0;
  for (; d + V <= n; d += V) {
    at::vec::fmadd(pv, Vec::loadu(v + d), Vec::loadu(acc + d)).store(acc + d);
  }
  for (; d < n; ++d) {
    acc[d] += p * v[d];
  }
}

// NaN-propagating max: a NaN score makes its row NaN.
template <typename acc_t>
acc_t max_nan(acc_t a, acc_t b) {
  return (a > b || std::isnan(a)) ? a : b;
}

// s = cap * tanh(s / cap) over a row.
template <typename acc_t>
void softcap_row(acc_t* s, int64_t n, acc_t cap) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  const Vec c(cap);
  int64_t j = 0;
  for (; j + V <= n; j += V) {
    (c * (Vec::loadu(s + j) / c).tanh()).store(s + j);
  }
  for (; j < n; ++j) {
    s[j] = cap * std::tanh(s[j] / cap);
  }
}

// NaN-propagating max of a row (-inf when empty).
template <typename acc_t>
acc_t max_of_row(const acc_t* s, int64_t n) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  acc_t m = -std::numeric_limits<acc_t>::infinity();
  int64_t j = 0;
  if (n >= V) {
    Vec mv = Vec::loadu(s);
    for (j = V; j + V <= n; j += V) {
      mv = at::vec::maximum(mv, Vec::loadu(s + j));
    }
    m = at::vec::vec_reduce_all<acc_t>([](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, mv);
  }
  for (; j < n; ++j) {
    m = max_nan(m, s[j]);
  }
  return m;
}

// s = exp(s - m) over a row; returns the sum.
template <typename acc_t>
acc_t exp_row(acc_t* s, int64_t n, acc_t m) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  const Vec mv(m);
  Vec sum_v(0);
  int64_t j = 0;
  for (; j + V <= n; j += V) {
    const Vec e = (Vec::loadu(s + j) - mv).exp();
    e.store(s + j);
    sum_v = sum_v + e;
  }
  acc_t sum = at::vec::vec_reduce_all<acc_t>([](Vec& x, Vec& y) { return x + y; }, sum_v);
  for (; j < n; ++j) {
    s[j] = std::exp(s[j] - m);
    sum += s[j];
  }
  return sum;
}

// Sum of a vector's lanes.
template <typename acc_t>
acc_t lane_sum(const Vectorized<acc_t>& v) {
  using Vec = Vectorized<acc_t>;
  return at::vec::vec_reduce_all<acc_t>([](Vec& x, Vec& y) { return x + y; }, v);
}

// `count` (<= the vector size) elements from p; lanes past it are zero.
template <typename acc_t>
Vectorized<acc_t> load_part(const acc_t* p, int64_t count) {
  using Vec = Vectorized<acc_t>;
  return count == Vec::size() ? Vec::loadu(p) : Vec::loadu(p, count);
}

// out[r * out_stride + j] = q[r] . k_rows[j] for NR query rows (q: NR rows
// of `dim`) and `n_keys` key rows: two keys at a time, so each query vector
// loaded serves two products and 2 * NR sums run side by side.
template <typename acc_t, int NR>
void dot_block(const acc_t* q, int64_t dim, const acc_t* const* k_rows, int64_t n_keys, acc_t* out,
               int64_t out_stride) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  int64_t j = 0;
  for (; j + 2 <= n_keys; j += 2) {
    Vec a0[NR];
    Vec a1[NR];
    for (int r = 0; r < NR; ++r) {
      a0[r] = Vec(0);
      a1[r] = Vec(0);
    }
    const acc_t* k0 = k_rows[j];
    const acc_t* k1 = k_rows[j + 1];
    for (int64_t d = 0; d < dim; d += V) {
      const int64_t c = std::min(V, dim - d);
      const Vec kv0 = load_part(k0 + d, c);
      const Vec kv1 = load_part(k1 + d, c);
      for (int r = 0; r < NR; ++r) {
        const Vec qv = load_part(q + r * dim + d, c);
        a0[r] = at::vec::fmadd(qv, kv0, a0[r]);
        a1[r] = at::vec::fmadd(qv, kv1, a1[r]);
      }
    }
    for (int r = 0; r < NR; ++r) {
      out[r * out_stride + j] = lane_sum(a0[r]);
      out[r * out_stride + j + 1] = lane_sum(a1[r]);
    }
  }
  for (; j < n_keys; ++j) {
    for (int r = 0; r < NR; ++r) {
      out[r * out_stride + j] = dot(q + r * dim, k_rows[j], dim);
    }
  }
}

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
constexpr bool kKeysInLanes = true;

// Lane t of the result: the sum of acc[t]'s lanes, for a full vector of
// accumulators. A fixed tree of shuffles and adds (three instructions a
// level): 45 instructions for 16 sums where one horizontal sum each takes
// about ten.
#if defined(CPU_CAPABILITY_AVX512)
C10_ALWAYS_INLINE __m512 transpose_sum(const Vectorized<float> (&acc)[16]) {
  __m512 halves[8];  // [2i]'s sum in 128-bit chunks 0 and 1, [2i + 1]'s in 2 and 3
  for (int i = 0; i < 8; ++i) {
    const __m512 a = acc[2 * i];
    const __m512 b = acc[2 * i + 1];
    halves[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  }
  __m512 quarters[4];  // chunk c: [4i + c]'s sum in its 4 lanes
  for (int i = 0; i < 4; ++i) {
    const __m512 a = halves[2 * i];
    const __m512 b = halves[2 * i + 1];
    quarters[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
  }
  // Chunk c: [c] in lanes 0 and 2, [4 + c] in 1 and 3 (then [8 + c], [12 + c]).
  const __m512 pairs0 = _mm512_add_ps(_mm512_unpacklo_ps(quarters[0], quarters[1]),
                                      _mm512_unpackhi_ps(quarters[0], quarters[1]));
  const __m512 pairs1 = _mm512_add_ps(_mm512_unpacklo_ps(quarters[2], quarters[3]),
                                      _mm512_unpackhi_ps(quarters[2], quarters[3]));
  const __m512d p0 = _mm512_castps_pd(pairs0);
  const __m512d p1 = _mm512_castps_pd(pairs1);
  // Lane 4c + m: [c + 4m].
  const __m512 sums = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(p0, p1)),
                                    _mm512_castpd_ps(_mm512_unpackhi_pd(p0, p1)));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, sums);
}
#else
C10_ALWAYS_INLINE __m256 transpose_sum(const Vectorized<float> (&acc)[8]) {
  __m256 halves[4];  // [2i]'s sum in 128-bit chunk 0, [2i + 1]'s in chunk 1
  for (int i = 0; i < 4; ++i) {
    const __m256 a = acc[2 * i];
    const __m256 b = acc[2 * i + 1];
    halves[i] =
        _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  }
  // Chunk c: [c] in lanes 0 and 2, [2 + c] in 1 and 3 (then [4 + c], [6 + c]).
  const __m256 pairs0 = _mm256_add_ps(_mm256_unpacklo_ps(halves[0], halves[1]),
                                      _mm256_unpackhi_ps(halves[0], halves[1]));
  const __m256 pairs1 = _mm256_add_ps(_mm256_unpacklo_ps(halves[2], halves[3]),
                                      _mm256_unpackhi_ps(halves[2], halves[3]));
  const __m256d p0 = _mm256_castps_pd(pairs0);
  const __m256d p1 = _mm256_castps_pd(pairs1);
  // Lane 4c + m: [c + 2m].
  const __m256 sums = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(p0, p1)),
                                    _mm256_castpd_ps(_mm256_unpackhi_pd(p0, p1)));
  return _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif

// out[t] = q . k_rows[t] for one float32 query row and a vector's width of
// key rows: the keys in lanes, so the sums need one transpose_sum for all
// of them instead of a horizontal sum each.
C10_ALWAYS_INLINE void dot_keys(const float* q, int64_t dim, const float* const* k_rows,
                                float* out) {
  using Vec = Vectorized<float>;
  constexpr int64_t V = Vec::size();
  Vec acc[V];
#pragma GCC unroll 16
  for (int64_t t = 0; t < V; ++t) {
    acc[t] = Vec(0);
  }
  for (int64_t d = 0; d < dim; d += V) {
    const int64_t c = std::min(V, dim - d);
    const Vec qv = load_part(q + d, c);
#pragma GCC unroll 16
    for (int64_t t = 0; t < V; ++t) {
      acc[t] = at::vec::fmadd(qv, load_part(k_rows[t] + d, c), acc[t]);
    }
  }
  Vec(transpose_sum(acc)).store(out);
}
#else
constexpr bool kKeysInLanes = false;
#endif

// out[r * out_stride + j] = q[r] . k_rows[j] for `n_rows` query rows and
// `n_keys` key rows.
template <typename acc_t>
void dot_rows(const acc_t* q, int64_t n_rows, int64_t dim, const acc_t* const* k_rows,
              int64_t n_keys, acc_t* out, int64_t out_stride) {
  int64_t j0 = 0;
  if constexpr (kKeysInLanes && std::is_same_v<acc_t, float>) {
    constexpr int64_t V = Vectorized<float>::size();
    for (; j0 + V <= n_keys; j0 += V) {
      for (int64_t r = 0; r < n_rows; ++r) {
        dot_keys(q + r * dim, dim, k_rows + j0, out + r * out_stride + j0);
      }
    }
    if (j0 == n_keys) {
      return;
    }
  }
  for (int64_t r = 0; r < n_rows; r += 4) {
    const acc_t* qr = q + r * dim;
    acc_t* o = out + r * out_stride + j0;
    const acc_t* const* k = k_rows + j0;
    const int64_t n = n_keys - j0;
    switch (std::min<int64_t>(4, n_rows - r)) {
      case 4:
        dot_block<acc_t, 4>(qr, dim, k, n, o, out_stride);
        break;
      case 3:
        dot_block<acc_t, 3>(qr, dim, k, n, o, out_stride);
        break;
      case 2:
        dot_block<acc_t, 2>(qr, dim, k, n, o, out_stride);
        break;
      default:
        dot_block<acc_t, 1>(qr, dim, k, n, o, out_stride);
    }
  }
}

// `count` (at most a vector's) elements of a stored value row as acc_t
// lanes, zeros past `count`: bfloat16 widened by its bits (exact), float16
// by the conversion instruction, in registers.
template <typename scalar_t, typename acc_t>
C10_ALWAYS_INLINE Vectorized<acc_t> load_widened(const scalar_t* p, int64_t count) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    return load_part(p, count);
  } else {
#if defined(CPU_CAPABILITY_AVX512)
    const __m256i raw =
        count == V ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                   : _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << count) - 1), p);
    if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    } else {
      return _mm512_cvtph_ps(raw);
    }
#elif defined(CPU_CAPABILITY_AVX2)
    alignas(16) uint16_t part[V] = {};
    const void* from = p;
    if (count < V) {
      std::memcpy(part, p, count * sizeof(scalar_t));
      from = part;
    }
    const __m128i raw = _mm_loadu_si128(static_cast<const __m128i*>(from));
    if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
    } else {
      return _mm256_cvtph_ps(raw);
    }
#else
    alignas(64) acc_t part[V] = {};
    for (int64_t i = 0; i < count; ++i) {
      part[i] = static_cast<acc_t>(p[i]);
    }
    return Vec::loadu(part);
#endif
  }
}

// Vectors of a value row summed together by accumulate_block: a whole row
// of 64 float32 on AVX-512 (four vectors for each of four rows, 16 of the
// 32 registers), two vectors on AVX2's 16 registers.
constexpr int kStripVectors = per_build(4, 2, 2);

// acc[r * v_dim + d] += p[r * p_stride + keys[t]] * v_rows[t][d] for t < n
// and NR rows: a strip of kStripVectors vectors of each of the NR
// accumulator rows stays in registers while the value rows (as stored,
// widened in registers) stream by.
template <typename scalar_t, typename acc_t, int NR>
void accumulate_block(const acc_t* p, int64_t p_stride, const int64_t* keys, int64_t n,
                      const scalar_t* const* v_rows, int64_t v_dim, acc_t* acc) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t V = Vec::size();
  for (int64_t d = 0; d < v_dim; d += kStripVectors * V) {
    int64_t count[kStripVectors];
    for (int s = 0; s < kStripVectors; ++s) {
      count[s] = std::clamp<int64_t>(v_dim - d - s * V, 0, V);
    }
    Vec a[NR][kStripVectors];
    for (int r = 0; r < NR; ++r) {
      for (int s = 0; s < kStripVectors; ++s) {
        a[r][s] = count[s] > 0 ? load_part(acc + r * v_dim + d + s * V, count[s]) : Vec(0);
      }
    }
    for (int64_t t = 0; t < n; ++t) {
      const int64_t j = keys[t];
      Vec v[kStripVectors];
      for (int s = 0; s < kStripVectors; ++s) {
        v[s] =
            count[s] > 0 ? load_widened<scalar_t, acc_t>(v_rows[t] + d + s * V, count[s]) : Vec(0);
      }
      for (int r = 0; r < NR; ++r) {
        const Vec w(p[r * p_stride + j]);
        for (int s = 0; s < kStripVectors; ++s) {
          a[r][s] = at::vec::fmadd(w, v[s], a[r][s]);
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      for (int s = 0; s < kStripVectors; ++s) {
        if (count[s] > 0) {
          a[r][s].store(acc + r * v_dim + d + s * V, count[s]);
        }
      }
    }
  }
}

template <typename scalar_t, typename acc_t>
void accumulate_rows(const acc_t* p, int64_t n_rows, int64_t p_stride, const int64_t* keys,
                     int64_t n, const scalar_t* const* v_rows, int64_t v_dim, acc_t* acc) {
  for (int64_t r = 0; r < n_rows; r += 4) {
    const acc_t* pr = p + r * p_stride;
    acc_t* ar = acc + r * v_dim;
    switch (std::min<int64_t>(4, n_rows - r)) {
      case 4:
        accumulate_block<scalar_t, acc_t, 4>(pr, p_stride, keys, n, v_rows, v_dim, ar);
        break;
      case 3:
        accumulate_block<scalar_t, acc_t, 3>(pr, p_stride, keys, n, v_rows, v_dim, ar);
        break;
      case 2:
        accumulate_block<scalar_t, acc_t, 2>(pr, p_stride, keys, n, v_rows, v_dim, ar);
        break;
      default:
        accumulate_block<scalar_t, acc_t, 1>(pr, p_stride, keys, n, v_rows, v_dim, ar);
    }
  }
}

// A row of `n` elements as acc_t: the row itself when it already is (and
// `copy` is false), else copied (widened) into `buffer`. The key rows are
// always copied: the scores read a block's rows in strips of a vector, an
// order the hardware prefetcher does not follow in memory, but does in L1
// after one sequential copy.
template <typename scalar_t, typename acc_t>
C10_ALWAYS_INLINE const acc_t* widened(const scalar_t* row, int64_t n, acc_t* buffer,
                                       bool copy = false) {
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    if (!copy) {
      return row;
    }
    std::memcpy(buffer, row, n * sizeof(acc_t));
    return buffer;
  } else {
    // bfloat16/float16 -> float32, a vector at a time (at::vec::convert
    // has no vectorized form for these).
    using VecS = Vectorized<scalar_t>;
    constexpr int64_t S = VecS::size();
    constexpr int64_t F = Vectorized<acc_t>::size();
    int64_t d = 0;
    for (; d + S <= n; d += S) {
      auto [lo, hi] = at::vec::convert_to_float<scalar_t>(VecS::loadu(row + d));
      lo.store(buffer + d);
      hi.store(buffer + d + F);
    }
    if (d < n) {
      auto [lo, hi] = at::vec::convert_to_float<scalar_t>(VecS::loadu(row + d, n - d));
      lo.store(buffer + d, std::min(F, n - d));
      if (n - d > F) {
        hi.store(buffer + d + F, n - d - F);
      }
    }
    return buffer;
  }
}

template <typename scalar_t>
void decode_attention_typed(const at::Tensor& out, const at::Tensor& query, const at::Tensor& key,
                            const at::Tensor& value, const at::Tensor& mask, bool is_causal,
                            double scale, double softcap) {
  using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
  constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
  const int64_t batch = query.size(0);
  const int64_t q_heads = query.size(1);
  const int64_t q_len = query.size(2);
  const int64_t dim = query.size(3);
  const int64_t kv_heads = key.size(1);
  const int64_t keys = key.size(2);
  const int64_t v_dim = value.size(3);
  const int64_t group = q_heads / kv_heads;
  // Rows of one key/value head: r = i * group + g, query head kv * group + g
  // at position i (positions outer, so a block's causal limits are close).
  const int64_t rows = q_len * group;
  const int64_t row_blocks = ceil_div(rows, kRowBlock);
  const int64_t blocks = batch * kv_heads * row_blocks;
  // Split the keys when there are few blocks. The split depends on the
  // shapes only, never on the thread count, so that every thread count
  // gives the same bits (python/README.md, "Threads and determinism").
  int64_t splits = 1;
  if (blocks < kParallelTasks) {
    splits =
        std::max<int64_t>(1, std::min(ceil_div(keys, kMinChunk), ceil_div(kParallelTasks, blocks)));
  }
  const int64_t chunk = ceil_div(keys, splits);
  splits = ceil_div(keys, chunk);

  const scalar_t* q_data = query.const_data_ptr<scalar_t>();
  const scalar_t* k_data = key.const_data_ptr<scalar_t>();
  const scalar_t* v_data = value.const_data_ptr<scalar_t>();
  scalar_t* out_data = out.mutable_data_ptr<scalar_t>();
  const bool has_mask = mask.defined();
  const bool bool_mask = has_mask && mask.scalar_type() == at::kBool;
  const bool* mask_bool = bool_mask ? mask.const_data_ptr<bool>() : nullptr;
  const float* mask_float = has_mask && !bool_mask ? mask.const_data_ptr<float>() : nullptr;
  const acc_t scale_acc = static_cast<acc_t>(scale);
  const acc_t cap = static_cast<acc_t>(softcap);
  // Strides read once: Tensor::stride() is a call that checks the tensor's
  // strides policy, which the per-key loops would otherwise repeat.
  const std::array<int64_t, 3> q_stride = {query.stride(0), query.stride(1), query.stride(2)};
  const std::array<int64_t, 3> k_stride = {key.stride(0), key.stride(1), key.stride(2)};
  const std::array<int64_t, 3> v_stride = {value.stride(0), value.stride(1), value.stride(2)};
  std::array<int64_t, 4> mask_stride = {};
  if (has_mask) {
    mask_stride = {mask.stride(0), mask.stride(1), mask.stride(2), mask.stride(3)};
  }

  // One row's partial result over one key chunk: running max, sum of
  // exponentials, whether the row may see any key of the chunk, and the
  // weighted sum of values.
  const int64_t partial_size = v_dim + 3;
  std::vector<acc_t> partials(splits > 1 ? blocks * splits * kRowBlock * partial_size : 0);

  auto write_row = [&](int64_t b, int64_t kv, int64_t r, const acc_t* values, acc_t divisor,
                       bool seen_any) {
    const int64_t i = r / group;
    const int64_t h = kv * group + r % group;
    scalar_t* o = out_data + ((b * q_heads + h) * q_len + i) * v_dim;
    for (int64_t d = 0; d < v_dim; ++d) {
      o[d] = static_cast<scalar_t>(seen_any ? values[d] / divisor : acc_t(0));
    }
  };

  at::parallel_for(0, blocks * splits, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> q_rows(kRowBlock * dim);
    std::vector<acc_t> scores(kRowBlock * chunk);
    std::vector<uint8_t> seen(kRowBlock * chunk);
    std::vector<acc_t> acc(kRowBlock * v_dim);
    std::vector<acc_t> row_max(kRowBlock);
    std::vector<acc_t> row_sum(kRowBlock);
    std::vector<uint8_t> row_seen(kRowBlock);
    std::vector<int64_t> visible_prefix(kRowBlock);
    std::vector<int64_t> mask_start(kRowBlock);  // a row's first mask element in the chunk
    std::vector<uint8_t> contributes(kRowBlock);
    std::vector<const acc_t*> row_ptrs(kKeyBlock);
    std::vector<int64_t> full_keys(kKeyBlock);
    std::vector<const scalar_t*> full_rows(kKeyBlock);
    std::vector<uint8_t> seers(kKeyBlock);  // rows (at most kRowBlock) that see a key
    // Widened key rows of one block for the scores, then (at another time) one
    // widened value row.
    std::vector<acc_t> block_buffer(std::max(kKeyBlock * dim, v_dim));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t split = task % splits;
      const int64_t block = task / splits;
      const int64_t row_block = block % row_blocks;
      const int64_t kv = (block / row_blocks) % kv_heads;
      const int64_t b = block / (row_blocks * kv_heads);
      const int64_t r0 = row_block * kRowBlock;
      const int64_t n_rows = std::min(kRowBlock, rows - r0);
      const int64_t j0 = split * chunk;
      int64_t j1 = std::min(keys, j0 + chunk);
      if (is_causal) {
        // The block's last position sees keys up to keys - q_len + i_last.
        const int64_t i_last = (r0 + n_rows - 1) / group;
        j1 = std::min(j1, std::max<int64_t>(j0, keys - q_len + i_last + 1));
      }
      const int64_t n_keys = j1 - j0;
      const scalar_t* k_head = k_data + b * k_stride[0] + kv * k_stride[1] + j0 * k_stride[2];
      const scalar_t* v_head = v_data + b * v_stride[0] + kv * v_stride[1] + j0 * v_stride[2];

      for (int64_t r = 0; r < n_rows; ++r) {
        const int64_t i = (r0 + r) / group;
        const int64_t h = kv * group + (r0 + r) % group;
        const scalar_t* q = q_data + b * q_stride[0] + h * q_stride[1] + i * q_stride[2];
        for (int64_t d = 0; d < dim; ++d) {
          q_rows[r * dim + d] = static_cast<acc_t>(q[d]) * scale_acc;
        }
      }
      // The keys each row may see are a prefix of the chunk: up to the
      // causal limit, and with a mask up to the last key it does not hide.
      // The keys past every row's prefix get no score: a static cache's
      // slots not yet written, which the mask hides, are most of a long
      // cache early in a generation.
      int64_t scored_keys = 0;
      for (int64_t r = 0; r < n_rows; ++r) {
        const int64_t i = (r0 + r) / group;
        const int64_t h = kv * group + (r0 + r) % group;
        const int64_t limit = is_causal ? keys - q_len + i : keys - 1;
        int64_t prefix = std::clamp<int64_t>(limit + 1 - j0, 0, n_keys);
        if (has_mask) {
          mask_start[r] =
              b * mask_stride[0] + h * mask_stride[1] + i * mask_stride[2] + j0 * mask_stride[3];
          auto hidden = [&](int64_t jj) {
            const int64_t offset = mask_start[r] + jj * mask_stride[3];
            return bool_mask ? !mask_bool[offset]
                             : mask_float[offset] == -std::numeric_limits<float>::infinity();
          };
          while (prefix > 0 && hidden(prefix - 1)) {
            --prefix;
          }
        }
        visible_prefix[r] = prefix;
        scored_keys = std::max(scored_keys, prefix);
      }
      // Scores, a block of keys at a time (widened to acc_t when stored
      // narrower).
      for (int64_t jb = 0; jb < scored_keys; jb += kKeyBlock) {
        const int64_t nb = std::min(kKeyBlock, scored_keys - jb);
        for (int64_t t = 0; t < nb; ++t) {
          row_ptrs[t] = widened(k_head + (jb + t) * k_stride[2], dim, block_buffer.data() + t * dim,
                                /*copy=*/true);
        }
        dot_rows(q_rows.data(), n_rows, dim, row_ptrs.data(), nb, scores.data() + jb, n_keys);
      }
      // Softcap, mask and causal limit; each row's max over the keys it sees.
      // Without a mask the keys a row sees are all of its prefix, handled
      // with vectors only.
      for (int64_t r = 0; r < n_rows; ++r) {
        acc_t* row_scores = scores.data() + r * n_keys;
        uint8_t* row_seen_keys = seen.data() + r * n_keys;
        const int64_t prefix = visible_prefix[r];
        if (cap > 0) {
          softcap_row(row_scores, prefix, cap);
        }
        acc_t m = kNegInf;
        bool any = false;
        if (!has_mask) {
          any = prefix > 0;
          m = max_of_row(row_scores, prefix);
        } else {
          // Branch-free passes the compiler vectorizes: which keys the row
          // sees, their scores plus the mask and -inf for the others; then
          // the max over them (the hidden keys' -inf changes it only where
          // the row sees none, when it is -inf anyway).
          const int64_t step = mask_stride[3];
          if (bool_mask) {
            const bool* row_mask = mask_bool + mask_start[r];
            for (int64_t jj = 0; jj < prefix; ++jj) {
              const bool visible = row_mask[jj * step];
              row_seen_keys[jj] = visible;
              row_scores[jj] = visible ? row_scores[jj] : kNegInf;
            }
          } else {
            const float* row_mask = mask_float + mask_start[r];
            for (int64_t jj = 0; jj < prefix; ++jj) {
              const float bias = row_mask[jj * step];
              const bool visible = bias != -std::numeric_limits<float>::infinity();
              row_seen_keys[jj] = visible;
              row_scores[jj] = visible ? row_scores[jj] + static_cast<acc_t>(bias) : kNegInf;
            }
          }
          uint8_t seen_some = 0;
          for (int64_t jj = 0; jj < prefix; ++jj) {
            seen_some |= row_seen_keys[jj];
          }
          any = seen_some != 0;
          m = max_of_row(row_scores, prefix);
        }
        row_max[r] = m;
        row_seen[r] = any;
        // Seen keys all at -inf: this chunk adds nothing (if no other chunk
        // has a finite score, the merge makes the row NaN, as softmax does).
        // Hidden keys hold -inf: exp gives 0 for them.
        row_sum[r] = (any && m != kNegInf) ? exp_row(row_scores, prefix, m) : acc_t(0);
      }
      // Weighted values: each value row read once for the block's rows.
      // A key seen by every row (that has a result) joins the register-
      // blocked sum; one seen by some rows only is added to those rows
      // alone, so no row multiplies a value it must not read (a static
      // cache's unwritten slot, a future position) by its zero weight.
      std::fill(acc.begin(), acc.begin() + n_rows * v_dim, acc_t(0));
      int64_t last_key = 0;
      for (int64_t r = 0; r < n_rows; ++r) {
        contributes[r] = row_seen[r] && row_max[r] != kNegInf;
        if (contributes[r]) {
          last_key = std::max(last_key, visible_prefix[r]);
        }
      }
      auto seen_by = [&](int64_t r, int64_t jj) {
        return contributes[r] && jj < visible_prefix[r] && (!has_mask || seen[r * n_keys + jj]);
      };
      for (int64_t jb = 0; jb < last_key; jb += kKeyBlock) {
        const int64_t nb = std::min(kKeyBlock, last_key - jb);
        // How many rows see each key of the block: a pass per row over the
        // block's keys (loops the compiler vectorizes), not a test per row
        // and key.
        std::fill(seers.begin(), seers.begin() + nb, uint8_t(0));
        for (int64_t r = 0; r < n_rows; ++r) {
          const int64_t seen_keys =
              contributes[r] ? std::clamp<int64_t>(visible_prefix[r] - jb, 0, nb) : 0;
          if (has_mask) {
            const uint8_t* row_seen_keys = seen.data() + r * n_keys + jb;
            for (int64_t t = 0; t < seen_keys; ++t) {
              seers[t] += row_seen_keys[t];
            }
          } else {
            for (int64_t t = 0; t < seen_keys; ++t) {
              seers[t] += 1;
            }
          }
        }
        int64_t n_full = 0;
        for (int64_t t = 0; t < nb; ++t) {
          const int64_t jj = jb + t;
          if (seers[t] == 0) {
            continue;
          }
          const scalar_t* v_row = v_head + jj * v_stride[2];
          if (seers[t] == n_rows) {
            full_rows[n_full] = v_row;
            full_keys[n_full++] = t;
          } else {
            const acc_t* widened_row = widened(v_row, v_dim, block_buffer.data());
            for (int64_t r = 0; r < n_rows; ++r) {
              if (seen_by(r, jj)) {
                axpy(acc.data() + r * v_dim, scores[r * n_keys + jj], widened_row, v_dim);
              }
            }
          }
        }
        accumulate_rows(scores.data() + jb, n_rows, n_keys, full_keys.data(), n_full,
                        full_rows.data(), v_dim, acc.data());
      }
      if (splits == 1) {
        for (int64_t r = 0; r < n_rows; ++r) {
          const bool nan_row = row_seen[r] && row_max[r] == kNegInf;
          if (nan_row) {
            std::fill(acc.begin() + r * v_dim, acc.begin() + (r + 1) * v_dim,
                      std::numeric_limits<acc_t>::quiet_NaN());
          }
          write_row(b, kv, r0 + r, acc.data() + r * v_dim, nan_row ? acc_t(1) : row_sum[r],
                    row_seen[r]);
        }
      } else {
        for (int64_t r = 0; r < n_rows; ++r) {
          acc_t* p = partials.data() + ((block * kRowBlock + r) * splits + split) * partial_size;
          p[0] = row_max[r];
          p[1] = row_sum[r];
          p[2] = row_seen[r];
          std::copy(acc.begin() + r * v_dim, acc.begin() + (r + 1) * v_dim, p + 3);
        }
      }
    }
  });
  if (splits == 1) {
    return;
  }
  // Merge each row's chunks: rescale to the largest max and normalise.
  at::parallel_for(0, blocks * kRowBlock, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> merged(v_dim);
    for (int64_t index = begin; index < end; ++index) {
      const int64_t block = index / kRowBlock;
      const int64_t r = block % row_blocks * kRowBlock + index % kRowBlock;
      if (r >= rows) {
        continue;
      }
      const int64_t kv = (block / row_blocks) % kv_heads;
      const int64_t b = block / (row_blocks * kv_heads);
      const acc_t* p = partials.data() + index * splits * partial_size;
      bool any = false;
      acc_t m = kNegInf;
      for (int64_t s = 0; s < splits; ++s) {
        if (p[s * partial_size + 2] != 0) {
          any = true;
          m = max_nan(m, p[s * partial_size]);
        }
      }
      if (any && m == kNegInf) {
        std::fill(merged.begin(), merged.end(), std::numeric_limits<acc_t>::quiet_NaN());
        write_row(b, kv, r, merged.data(), acc_t(1), true);
        continue;
      }
      std::fill(merged.begin(), merged.end(), acc_t(0));
      acc_t sum = 0;
      for (int64_t s = 0; s < splits; ++s) {
        const acc_t* part = p + s * partial_size;
        if (part[2] == 0 || part[0] == kNegInf) {
          continue;
        }
        const acc_t weight = std::exp(part[0] - m);
        sum += weight * part[1];
        axpy(merged.data(), weight, part + 3, v_dim);
      }
      write_row(b, kv, r, merged.data(), sum, any);
    }
  });
}

void decode_attention_kernel_impl(const at::Tensor& out, const at::Tensor& query,
                                  const at::Tensor& key, const at::Tensor& value,
                                  const at::Tensor& mask, bool is_causal, double scale,
                                  double softcap) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, query.scalar_type(), "fuseops::decode_attention", [&] {
        decode_attention_typed<scalar_t>(out, query, key, value, mask, is_causal, scale, softcap);
      });
}

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(DecodeAttentionCpuKernels::forward, &decode_attention_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
