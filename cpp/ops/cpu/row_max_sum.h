#pragma once
// The softmax statistics of one row in one pass, shared by the kernels that
// need a row's logsumexp (cross_entropy, jsd); for kernel files compiled per
// CPU capability.

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include <ATen/OpMathType.h>

#include "ops/cpu/activation_math.h"
#include "ops/cpu/elementwise.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {

// (m, s) with s = sum over the row of exp(z - m), z = logit(x) and m the
// row's maximum of z. `logit` maps a vector and a scalar of the opmath type
// (a softcap, a 1 / temperature scale) and must round both alike, so that the
// tail agrees with the vector body. Each lane keeps its own maximum, starting
// from the lowest finite value so that lanes of -Inf logits add exp(-Inf) = 0
// instead of exp(-Inf - -Inf) = NaN.
template <typename T, typename Logit>
std::pair<at::opmath_type<T>, at::opmath_type<T>> row_max_sum(const T* x, int64_t n,
                                                              const Logit& logit) {
  using acc_t = at::opmath_type<T>;
  using V = Vec<acc_t>;
  using Block = OpmathBlock<T>;
  // Two blocks per step: one rescale of the running sum per 2 (float32) or
  // 4 (bfloat16/float16) vectors of exponentials.
  constexpr int64_t kStep = 2 * Block::kSize;
  constexpr int kRegs = 2 * Block::kRegisters;
  V m_v(std::numeric_limits<acc_t>::lowest());
  V s_v(0);
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    const auto a = Block::load(x + i);
    const auto b = Block::load(x + i + Block::kSize);
    V z[kRegs];
    for (int r = 0; r < Block::kRegisters; ++r) {
      z[r] = logit(a[r]);
      z[Block::kRegisters + r] = logit(b[r]);
    }
    V m_new = m_v;
    for (int r = 0; r < kRegs; ++r) {
      m_new = at::vec::maximum(m_new, z[r]);
    }
    V s = s_v * activation_exp<acc_t>(m_v - m_new);
    for (int r = 0; r < kRegs; ++r) {
      s += activation_exp<acc_t>(z[r] - m_new);
    }
    s_v = s;
    m_v = m_new;
  }
  alignas(64) acc_t m_lanes[V::size()];
  alignas(64) acc_t s_lanes[V::size()];
  m_v.store(m_lanes);
  s_v.store(s_lanes);
  acc_t m = m_lanes[0];
  for (int l = 1; l < V::size(); ++l) {
    // A NaN lane makes the row NaN, as at::vec::maximum does within a lane.
    if (std::isnan(m_lanes[l]) || m_lanes[l] > m) {
      m = m_lanes[l];
    }
  }
  acc_t s = 0;
  for (int l = 0; l < V::size(); ++l) {
    s += s_lanes[l] * std::exp(m_lanes[l] - m);
  }
  for (; i < n; ++i) {
    const acc_t z = logit(static_cast<acc_t>(x[i]));
    if (z > m) {
      s = s * std::exp(m - z) + acc_t(1);
      m = z;
    } else {
      s += std::exp(z - m);
    }
  }
  return {m, s};
}

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
