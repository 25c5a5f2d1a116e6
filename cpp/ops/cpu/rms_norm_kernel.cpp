// rms_norm / fused_add_rms_norm CPU kernels; compiled once per CPU capability
// (FuseopsCpuKernels.cmake).
//
// Rows are independent: at::parallel_for hands each thread a run of rows.
// A row is read from memory once: the first pass (sum of squares, and for
// fused_add_rms_norm the residual add) brings it into L1/L2, the second
// pass rereads it from there. bfloat16/float16 are widened to float32
// Vectorized lanes and rounded once on store; float64 computes in double.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <tuple>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/zeros.h>

#include "ops/cpu/elementwise.h"
#include "ops_generated/cpu/rms_norm.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

using at::vec::Vectorized;

// One Vectorized<scalar_t> worth of elements, held as Vectorized<opmath_t>
// parts (two float32 parts for bfloat16/float16, one otherwise).
template <typename scalar_t>
struct Lanes {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = Vectorized<scalar_t>;
  using OpVec = Vectorized<opmath_t>;
  static constexpr int64_t kSize = Vec::size();
  static constexpr int kParts = static_cast<int>(kSize / OpVec::size());

  std::array<OpVec, kParts> part;

  static Lanes widen(const Vec& v) {
    if constexpr (kParts == 1) {
      return {{v}};
    } else {
      auto [lo, hi] = at::vec::convert_to_float<scalar_t>(v);
      return {{lo, hi}};
    }
  }
  // `count` < kSize loads a row's tail; the missing lanes are zero.
  static Lanes load(const scalar_t* p) { return widen(Vec::loadu(p)); }
  static Lanes load(const scalar_t* p, int64_t count) { return widen(Vec::loadu(p, count)); }

  Vec narrow() const {
    if constexpr (kParts == 1) {
      return part[0];
    } else {
      return narrow_from_float<scalar_t>(part[0], part[1]);
    }
  }
  void store(scalar_t* p) const { narrow().store(p); }
  void store(scalar_t* p, int64_t count) const { narrow().store(p, count); }

  // Opmath values (weight, partial sums) stored as plain opmath arrays.
  static Lanes load_opmath(const opmath_t* p, int64_t count = kSize) {
    Lanes l;
    for (int k = 0; k < kParts; ++k) {
      const int64_t n = std::clamp<int64_t>(count - k * OpVec::size(), 0, OpVec::size());
      l.part[k] = n == OpVec::size() ? OpVec::loadu(p + k * OpVec::size())
                                     : OpVec::loadu(p + k * OpVec::size(), n);
    }
    return l;
  }
  void store_opmath(opmath_t* p, int64_t count = kSize) const {
    for (int k = 0; k < kParts; ++k) {
      const int64_t n = std::clamp<int64_t>(count - k * OpVec::size(), 0, OpVec::size());
      if (n == OpVec::size()) {
        part[k].store(p + k * OpVec::size());
      } else if (n > 0) {
        part[k].store(p + k * OpVec::size(), n);
      }
    }
  }
};

// Calls body(offset, count) over [0, n) in steps of L::kSize; count is
// kSize except for the tail.
template <typename L, typename Body>
inline void for_each_step(int64_t n, const Body& body) {
  int64_t i = 0;
  for (; i + L::kSize <= n; i += L::kSize) {
    body(i, L::kSize);
  }
  if (i < n) {
    body(i, n - i);
  }
}

template <typename L>
inline L load_step(const typename L::Vec::value_type* p, int64_t count) {
  return count == L::kSize ? L::load(p) : L::load(p, count);
}

template <typename L>
inline void store_step(const L& l, typename L::Vec::value_type* p, int64_t count) {
  if (count == L::kSize) {
    l.store(p);
  } else {
    l.store(p, count);
  }
}

template <typename opmath_t>
inline opmath_t sum_lanes(const Vectorized<opmath_t>& v) {
  return at::vec::vec_reduce_all([](auto a, auto b) { return a + b; }, v);
}

// Sum of squares of x[0, n), two independent accumulator chains so the
// FMA latency does not bound the loop.
template <typename scalar_t>
at::opmath_type<scalar_t> sum_of_squares(const scalar_t* x, int64_t n) {
  using L = Lanes<scalar_t>;
  using OpVec = typename L::OpVec;
  OpVec acc0(0), acc1(0);
  int64_t i = 0;
  for (; i + 2 * L::kSize <= n; i += 2 * L::kSize) {
    const L a = L::load(x + i);
    const L b = L::load(x + i + L::kSize);
    for (int k = 0; k < L::kParts; ++k) {
      acc0 = at::vec::fmadd(a.part[k], a.part[k], acc0);
      acc1 = at::vec::fmadd(b.part[k], b.part[k], acc1);
    }
  }
  for_each_step<L>(n - i, [&](int64_t j, int64_t count) {
    const L a = load_step<L>(x + i + j, count);
    for (int k = 0; k < L::kParts; ++k) {
      acc0 = at::vec::fmadd(a.part[k], a.part[k], acc0);
    }
  });
  return sum_lanes(acc0 + acc1);
}

// out = x * rstd * weight over one row; weight_t: the computation dtype, or
// the input's own (widened as it is loaded: the same values).
template <typename scalar_t, typename weight_t>
void scale_row(scalar_t* out, const scalar_t* x, const weight_t* weight,
               at::opmath_type<scalar_t> rstd, int64_t n) {
  using L = Lanes<scalar_t>;
  using OpVec = typename L::OpVec;
  const OpVec r(rstd);
  for_each_step<L>(n, [&](int64_t i, int64_t count) {
    L v = load_step<L>(x + i, count);
    if (weight != nullptr) {
      L w;
      if constexpr (std::is_same_v<weight_t, at::opmath_type<scalar_t>>) {
        w = L::load_opmath(weight + i, count);
      } else {
        static_assert(std::is_same_v<weight_t, scalar_t>);
        w = load_step<L>(weight + i, count);
      }
      for (int k = 0; k < L::kParts; ++k) {
        v.part[k] = v.part[k] * r * w.part[k];
      }
    } else {
      for (int k = 0; k < L::kParts; ++k) {
        v.part[k] = v.part[k] * r;
      }
    }
    store_step(v, out + i, count);
  });
}

// sum = x + residual, rounded to scalar_t and stored; returns the sum of
// squares of the stored (rounded) values, so that the norm is that of the
// new residual exactly as later layers will read it.
template <typename scalar_t>
at::opmath_type<scalar_t> add_and_sum_of_squares(scalar_t* sum, const scalar_t* x,
                                                 const scalar_t* residual, int64_t n) {
  using L = Lanes<scalar_t>;
  using OpVec = typename L::OpVec;
  OpVec acc0(0), acc1(0);
  for_each_step<L>(n, [&](int64_t i, int64_t count) {
    const L a = load_step<L>(x + i, count);
    const L b = load_step<L>(residual + i, count);
    L s;
    for (int k = 0; k < L::kParts; ++k) {
      s.part[k] = a.part[k] + b.part[k];
    }
    const typename L::Vec rounded = s.narrow();
    if (count == L::kSize) {
      rounded.store(sum + i);
    } else {
      rounded.store(sum + i, count);
    }
    const L t = L::widen(rounded);
    // Alternating accumulators: two independent FMA chains.
    acc0 = at::vec::fmadd(t.part[0], t.part[0], acc0);
    if constexpr (L::kParts == 2) {
      acc1 = at::vec::fmadd(t.part[1], t.part[1], acc1);
    }
  });
  return sum_lanes(acc0 + acc1);
}

template <typename scalar_t>
void forward_impl(const detail::RmsNormForwardArgs& args) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t hidden = args.input.size(-1);
  const int64_t rows = args.input.numel() / hidden;
  const scalar_t* x = args.input.const_data_ptr<scalar_t>();
  const scalar_t* residual =
      args.residual.defined() ? args.residual.const_data_ptr<scalar_t>() : nullptr;
  scalar_t* residual_out =
      args.residual_out.defined() ? args.residual_out.mutable_data_ptr<scalar_t>() : nullptr;
  scalar_t* out = args.out.mutable_data_ptr<scalar_t>();
  // The weight in the computation dtype, or in the input's (rms_norm.cpp's
  // forward_kernel_weight): one of the two is set, or neither (no weight).
  const bool own_dtype_weight =
      args.weight.defined() && args.weight.scalar_type() == args.input.scalar_type();
  const opmath_t* weight =
      args.weight.defined() && !own_dtype_weight ? args.weight.const_data_ptr<opmath_t>() : nullptr;
  const scalar_t* own_weight = own_dtype_weight ? args.weight.const_data_ptr<scalar_t>() : nullptr;
  opmath_t* rstd_out = args.rstd.defined() ? args.rstd.mutable_data_ptr<opmath_t>() : nullptr;
  const opmath_t eps = static_cast<opmath_t>(args.eps);

  at::parallel_for(0, rows, row_grain(hidden), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t offset = row * hidden;
      const scalar_t* normalized = x + offset;
      opmath_t sum_sq;
      if (residual != nullptr) {
        sum_sq =
            add_and_sum_of_squares(residual_out + offset, x + offset, residual + offset, hidden);
        normalized = residual_out + offset;
      } else {
        sum_sq = sum_of_squares(x + offset, hidden);
      }
      const opmath_t rstd = opmath_t(1) / std::sqrt(sum_sq / static_cast<opmath_t>(hidden) + eps);
      if (rstd_out != nullptr) {
        rstd_out[row] = rstd;
      }
      if (own_weight != nullptr) {
        scale_row(out + offset, normalized, own_weight, rstd, hidden);
      } else {
        scale_row(out + offset, normalized, weight, rstd, hidden);
      }
    }
  });
}

// Backward of y = x * rstd * w over one row, with gw = grad * w:
//   grad_x = rstd * (gw - x * rstd^2 * mean(gw * x))  [+ grad_residual]
//   grad_w += grad * x * rstd   (into this task's partial sum)
template <typename scalar_t>
void backward_row(scalar_t* grad_x, at::opmath_type<scalar_t>* grad_w_partial, const scalar_t* grad,
                  const scalar_t* grad_residual, const scalar_t* x,
                  const at::opmath_type<scalar_t>* weight, at::opmath_type<scalar_t> rstd,
                  int64_t n) {
  using L = Lanes<scalar_t>;
  using OpVec = typename L::OpVec;
  using opmath_t = at::opmath_type<scalar_t>;

  OpVec dot0(0), dot1(0);
  for_each_step<L>(n, [&](int64_t i, int64_t count) {
    const L g = load_step<L>(grad + i, count);
    const L v = load_step<L>(x + i, count);
    if (weight != nullptr) {
      const L w = L::load_opmath(weight + i, count);
      dot0 = at::vec::fmadd(g.part[0] * w.part[0], v.part[0], dot0);
      if constexpr (L::kParts == 2) {
        dot1 = at::vec::fmadd(g.part[1] * w.part[1], v.part[1], dot1);
      }
    } else {
      dot0 = at::vec::fmadd(g.part[0], v.part[0], dot0);
      if constexpr (L::kParts == 2) {
        dot1 = at::vec::fmadd(g.part[1], v.part[1], dot1);
      }
    }
  });
  const opmath_t dot = sum_lanes(dot0 + dot1);
  const OpVec r(rstd);
  const OpVec c(rstd * rstd * dot / static_cast<opmath_t>(n));

  for_each_step<L>(n, [&](int64_t i, int64_t count) {
    const L g = load_step<L>(grad + i, count);
    const L v = load_step<L>(x + i, count);
    L gx;
    if (weight != nullptr) {
      const L w = L::load_opmath(weight + i, count);
      L partial = L::load_opmath(grad_w_partial + i, count);
      for (int k = 0; k < L::kParts; ++k) {
        gx.part[k] = r * at::vec::fnmadd(v.part[k], c, g.part[k] * w.part[k]);
        partial.part[k] = at::vec::fmadd(g.part[k] * v.part[k], r, partial.part[k]);
      }
      partial.store_opmath(grad_w_partial + i, count);
    } else {
      for (int k = 0; k < L::kParts; ++k) {
        gx.part[k] = r * at::vec::fnmadd(v.part[k], c, g.part[k]);
      }
    }
    if (grad_residual != nullptr) {
      const L gr = load_step<L>(grad_residual + i, count);
      for (int k = 0; k < L::kParts; ++k) {
        gx.part[k] = gx.part[k] + gr.part[k];
      }
    }
    store_step(gx, grad_x + i, count);
  });
}

template <typename scalar_t>
void backward_impl(const detail::RmsNormBackwardArgs& args) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t hidden = args.input.size(-1);
  const int64_t rows = args.input.numel() / hidden;
  const scalar_t* grad = args.grad_output.const_data_ptr<scalar_t>();
  const scalar_t* grad_residual =
      args.grad_residual.defined() ? args.grad_residual.const_data_ptr<scalar_t>() : nullptr;
  const scalar_t* x = args.input.const_data_ptr<scalar_t>();
  const opmath_t* weight = args.weight.defined() ? args.weight.const_data_ptr<opmath_t>() : nullptr;
  const opmath_t* rstd = args.rstd.const_data_ptr<opmath_t>();
  scalar_t* grad_x = args.grad_input.mutable_data_ptr<scalar_t>();

  // The weight gradient sums over every row. Rows are split into blocks
  // (row_sum_blocks: their count depends on the rows alone, so the result
  // has the same bits for any thread count); each block accumulates its own
  // partial sum in opmath (a (hidden,) vector that stays in cache next to
  // the rows), and the partials are added at the end in block order.
  const int64_t blocks = row_sum_blocks(rows, hidden);
  // One block accumulates straight into grad_weight (zeroed by the caller).
  at::Tensor partials;
  opmath_t* partial_base = nullptr;
  if (weight != nullptr) {
    if (blocks == 1) {
      partial_base = args.grad_weight.mutable_data_ptr<opmath_t>();
    } else {
      partials = at::zeros({blocks, hidden}, args.grad_weight.options());
      partial_base = partials.mutable_data_ptr<opmath_t>();
    }
  }
  at::parallel_for(0, blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    for (int64_t block = block_begin; block < block_end; ++block) {
      const int64_t row_begin = rows * block / blocks;
      const int64_t row_end = rows * (block + 1) / blocks;
      opmath_t* partial = partial_base != nullptr ? partial_base + block * hidden : nullptr;
      for (int64_t row = row_begin; row < row_end; ++row) {
        const int64_t offset = row * hidden;
        backward_row(grad_x + offset, partial, grad + offset,
                     grad_residual != nullptr ? grad_residual + offset : nullptr, x + offset,
                     weight, rstd[row], hidden);
      }
    }
  });
  if (weight != nullptr && blocks > 1) {
    opmath_t* grad_w = args.grad_weight.mutable_data_ptr<opmath_t>();
    using OpVec = Vectorized<opmath_t>;
    int64_t j = 0;
    for (; j + OpVec::size() <= hidden; j += OpVec::size()) {
      OpVec sum = OpVec::loadu(partial_base + j);
      for (int64_t block = 1; block < blocks; ++block) {
        sum = sum + OpVec::loadu(partial_base + block * hidden + j);
      }
      sum.store(grad_w + j);
    }
    for (; j < hidden; ++j) {
      opmath_t sum = partial_base[j];
      for (int64_t block = 1; block < blocks; ++block) {
        sum += partial_base[block * hidden + j];
      }
      grad_w[j] = sum;
    }
  }
}

void rms_norm_forward_kernel_impl(const detail::RmsNormForwardArgs& args) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, args.input.scalar_type(),
                                  "fuseops::rms_norm", [&] { forward_impl<scalar_t>(args); });
}

void rms_norm_backward_kernel_impl(const detail::RmsNormBackwardArgs& args) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, args.input.scalar_type(),
                                  "fuseops::rms_norm_backward",
                                  [&] { backward_impl<scalar_t>(args); });
}

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(RmsNormCpuKernels::forward, &rms_norm_forward_kernel_impl);
FUSEOPS_REGISTER_CPU_KERNEL(RmsNormCpuKernels::backward, &rms_norm_backward_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
