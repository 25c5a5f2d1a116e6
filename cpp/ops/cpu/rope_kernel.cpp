// rope CPU kernels; compiled once per CPU capability (FuseopsCpuKernels.cmake).
//
// One pass over memory: each (token, head) row of query and key is read once
// and written once; the token's cos/sin rows (float32, a few hundred bytes
// shared by all heads of the token) stay in cache. Rows are split across
// threads; within a row the rotation runs on float32 (float64) vectors of
// 2 x Vectorized<opmath> elements at a time.

#include <algorithm>
#include <array>
#include <cstring>

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>

#include "ops/cpu/elementwise.h"
#include "ops_generated/cpu/rope.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

template <typename scalar_t>
struct Pairs {
  using Block = OpmathBlock<scalar_t>;
  using opmath_t = typename Block::opmath_t;
  using Vec = typename Block::Vec;
  using Regs = std::array<Vec, 2>;
  static constexpr int64_t kVec = Vec::size();
  // Elements one step handles: two opmath vectors.
  static constexpr int64_t kStep = 2 * kVec;

  C10_ALWAYS_INLINE static Vec load_part(const scalar_t* p, int64_t count) {
    return Block::load(p, std::min<int64_t>(count, kVec))[0];
  }

  // `count` (<= kStep) elements of scalar_t as two opmath vectors; lanes
  // past `count` are zero.
  C10_ALWAYS_INLINE static Regs load(const scalar_t* p, int64_t count) {
    if constexpr (Block::kReduced) {
      static_assert(Block::kSize == kStep);
      const auto v = Block::load(p, count);
      return {v[0], v[1]};
    } else {
      return {load_part(p, count), count > kVec ? load_part(p + kVec, count - kVec) : Vec(0)};
    }
  }

  C10_ALWAYS_INLINE static void store(scalar_t* p, const Regs& v, int64_t count) {
    if constexpr (Block::kReduced) {
      Block::store(p, {v[0], v[1]}, count);
    } else {
      Block::store(p, {v[0]}, std::min<int64_t>(count, kVec));
      if (count > kVec) {
        Block::store(p + kVec, {v[1]}, count - kVec);
      }
    }
  }

  C10_ALWAYS_INLINE static Vec load_table_part(const opmath_t* p, int64_t count) {
    if (count >= kVec) {
      return Vec::loadu(p);
    }
    return count > 0 ? Vec::loadu(p, count) : Vec(0);
  }

  C10_ALWAYS_INLINE static Regs load_table(const opmath_t* p, int64_t count) {
    return {load_table_part(p, count), load_table_part(p + kVec, count - kVec)};
  }

  // A table of the input's own dtype, widened as it is loaded.
  C10_ALWAYS_INLINE static Regs load_table(const scalar_t* p, int64_t count)
    requires(!std::is_same_v<scalar_t, opmath_t>)
  {
    return load(p, count);
  }
};

// One row of head_dim elements: `x` rotated into `o` (which may be `x`);
// table_t: the cos/sin rows' dtype, the computation dtype or the input's.
template <typename scalar_t, bool kInterleaved, bool kTranspose, typename table_t>
C10_ALWAYS_INLINE void rotate_row(scalar_t* o, const scalar_t* x, const table_t* c,
                                  const table_t* s, int64_t rotary_dim, int64_t head_dim) {
  using P = Pairs<scalar_t>;
  using Vec = typename P::Vec;
  if constexpr (kInterleaved) {
    // Pairs (2j, 2j+1): split into even and odd lanes, rotate, merge.
    for (int64_t i = 0; i < rotary_dim; i += P::kStep) {
      const int64_t n = std::min<int64_t>(P::kStep, rotary_dim - i);
      const auto xv = P::load(x + i, n);
      const auto cv = P::load_table(c + i, n);
      const auto sv = P::load_table(s + i, n);
      const auto [xe, xo] = at::vec::deinterleave2(xv[0], xv[1]);
      const auto [ce, co] = at::vec::deinterleave2(cv[0], cv[1]);
      const auto [se, so] = at::vec::deinterleave2(sv[0], sv[1]);
      Vec even, odd;
      if constexpr (kTranspose) {
        even = at::vec::fmadd(xo, so, xe * ce);
        odd = at::vec::fmsub(xo, co, xe * se);
      } else {
        even = at::vec::fmsub(xe, ce, xo * se);
        odd = at::vec::fmadd(xe, so, xo * co);
      }
      const auto [lo, hi] = at::vec::interleave2(even, odd);
      P::store(o + i, {lo, hi}, n);
    }
  } else {
    // Pairs (j, j + rotary_dim/2), as rotate_half pairs them.
    const int64_t half = rotary_dim / 2;
    for (int64_t j = 0; j < half; j += P::kStep) {
      const int64_t n = std::min<int64_t>(P::kStep, half - j);
      const auto x1 = P::load(x + j, n);
      const auto x2 = P::load(x + half + j, n);
      const auto c1 = P::load_table(c + j, n);
      const auto c2 = P::load_table(c + half + j, n);
      const auto s1 = P::load_table(s + j, n);
      const auto s2 = P::load_table(s + half + j, n);
      typename P::Regs o1, o2;
      for (int r = 0; r < 2; ++r) {
        if constexpr (kTranspose) {
          o1[r] = at::vec::fmadd(x2[r], s2[r], x1[r] * c1[r]);
          o2[r] = at::vec::fmsub(x2[r], c2[r], x1[r] * s1[r]);
        } else {
          o1[r] = at::vec::fmsub(x1[r], c1[r], x2[r] * s1[r]);
          o2[r] = at::vec::fmadd(x1[r], s2[r], x2[r] * c2[r]);
        }
      }
      P::store(o + j, o1, n);
      P::store(o + half + j, o2, n);
    }
  }
  if (o != x && head_dim > rotary_dim) {
    std::memcpy(o + rotary_dim, x + rotary_dim, (head_dim - rotary_dim) * sizeof(scalar_t));
  }
}

template <typename scalar_t, bool kInterleaved, bool kTranspose, typename table_t>
void rope_impl(const detail::RopeKernelArgs& a) {
  const int64_t tokens = a.input.size(0);
  const int64_t head_dim = a.input.size(2);
  const int64_t q_heads = a.input.size(1);
  const int64_t k_heads = a.key.defined() ? a.key.size(1) : 0;
  const int64_t heads = q_heads + k_heads;
  const int64_t rotary_dim = a.cos.size(1);
  const table_t* cos = a.cos.const_data_ptr<table_t>();
  const table_t* sin = a.sin.const_data_ptr<table_t>();
  const int64_t* positions =
      a.positions.defined() ? a.positions.const_data_ptr<int64_t>() : nullptr;

  struct View {
    scalar_t* out;
    const scalar_t* in;
    int64_t out_token, out_head, in_token, in_head;
  };
  auto view = [](const at::Tensor& out, const at::Tensor& in) {
    return View{out.mutable_data_ptr<scalar_t>(),
                in.const_data_ptr<scalar_t>(),
                out.stride(0),
                out.stride(1),
                in.stride(0),
                in.stride(1)};
  };
  const View q = view(a.out, a.input);
  const View k = a.key.defined() ? view(a.key_out, a.key) : View{};

  at::parallel_for(0, tokens * heads, row_grain(head_dim), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row / heads;
      const int64_t h = row % heads;
      const int64_t table_row = positions != nullptr ? positions[t] : t;
      const table_t* c = cos + table_row * rotary_dim;
      const table_t* s = sin + table_row * rotary_dim;
      const View& v = h < q_heads ? q : k;
      const int64_t head = h < q_heads ? h : h - q_heads;
      rotate_row<scalar_t, kInterleaved, kTranspose>(v.out + t * v.out_token + head * v.out_head,
                                                     v.in + t * v.in_token + head * v.in_head, c, s,
                                                     rotary_dim, head_dim);
    }
  });
}

template <typename scalar_t, typename table_t>
void rope_with_tables(const detail::RopeKernelArgs& args) {
  if (args.interleaved) {
    args.transpose ? rope_impl<scalar_t, true, true, table_t>(args)
                   : rope_impl<scalar_t, true, false, table_t>(args);
  } else {
    args.transpose ? rope_impl<scalar_t, false, true, table_t>(args)
                   : rope_impl<scalar_t, false, false, table_t>(args);
  }
}

void rope_kernel_impl(const detail::RopeKernelArgs& args) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, args.input.scalar_type(),
                                  "fuseops::rope", [&] {
                                    using opmath_t = at::opmath_type<scalar_t>;
                                    if constexpr (!std::is_same_v<scalar_t, opmath_t>) {
                                      if (args.cos.scalar_type() == args.input.scalar_type()) {
                                        rope_with_tables<scalar_t, scalar_t>(args);
                                        return;
                                      }
                                    }
                                    rope_with_tables<scalar_t, opmath_t>(args);
                                  });
}

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(RopeCpuKernels::rope, &rope_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
