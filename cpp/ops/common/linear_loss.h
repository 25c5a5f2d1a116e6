#pragma once
// What the losses fused with their linear layer (linear_cross_entropy,
// fused_linear_jsd) share: they run the rows in chunks whose logits are
// formed, turned into the loss and their gradient, and dropped, so that
// [N, V] logits never exist; the weight's gradient accumulates over the
// chunks in the computation dtype.

#include <algorithm>
#include <cstdint>
#include <optional>

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include "ops/common/output_memory.h"
#include "ops/common/widened_products.h"

namespace fuseops::detail {

// What the gradients of a fused linear loss are taken for: none, a
// grad_output of 1 (ones per row for reduction "none"), the input's alone
// for a grad_output of 1 (a frozen head: no weight or bias gradient), or the
// given grad_output of the loss's shape (the recomputing backward).
enum class LinearLossGradient { None, OfOne, InputOfOne, OfGradOutput };

// The rows per chunk for `rows` rows of `hidden` inputs and `vocab` classes:
// a chunk's logits take about 4 times the memory of the input (at least 64
// rows, to keep the GEMMs efficient). Each chunk adds its weight gradient to
// the accumulator in a pass over [V, H] (and widened products widen the
// weight twice), which fewer chunks make cheaper (float32 figures before and
// after 4 times the input instead of once: PERFORMANCE.md, section
// "fused_linear_jsd"). At most 1024 rows: the weight gradient's GEMM sums
// over a chunk's rows, and MKL splits a long sum between threads when the
// gradient is small (4096 rows of a [1000, 256] head in one chunk gave other
// bits with 2 threads than with 1; chunks of 1024 rows do not).
inline int64_t linear_loss_chunk_rows(int64_t rows, int64_t hidden, int64_t vocab) {
  constexpr int64_t kChunkScale = 4;
  constexpr int64_t kMaxChunkRows = 1024;
  const int64_t scaled = kChunkScale * ((rows * hidden + vocab - 1) / std::max<int64_t>(vocab, 1));
  return std::min({rows, kMaxChunkRows, std::max<int64_t>(64, scaled)});
}

// One linear head [V, H] (bias [V], optional) of a fused linear loss: a
// chunk's logits, and from their gradient the chunk's input gradient and the
// weight's (and bias') gradient, accumulated over the chunks in the
// computation dtype (float32 for bfloat16/float16, written into the outputs
// by `finish`).
class LinearLossHead {
 public:
  // `weight` contiguous; `grad_weight` and `grad_bias` the gradients'
  // outputs (undefined for a head without gradients, or without a bias).
  LinearLossHead(const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& grad_weight,
                 const at::Tensor& grad_bias);

  // out [n, V] (the weight's dtype) = x [n, H] @ weight^T (+ bias).
  void logits(const at::Tensor& out, const at::Tensor& x);

  // From grad_logits [n, V] of x [n, H]: grad_input [n, H] = grad_logits @
  // weight, and grad_logits^T @ x (the column sums of grad_logits) added to
  // the weight's (bias') gradient.
  void backward(const at::Tensor& grad_logits, const at::Tensor& x, const at::Tensor& grad_input);

  // Writes the accumulated gradients into the outputs.
  void finish();

 private:
  at::Tensor weight_;
  at::Tensor bias_;
  at::Tensor grad_weight_;
  at::Tensor grad_bias_;
  at::Tensor weight_acc_;
  at::Tensor bias_acc_;
  // The bfloat16/float16 GEMMs' product block, added to the float32
  // accumulator (native products).
  at::Tensor weight_block_;
  // The widened path's weight (products_widened: the products run in
  // float32 on operands widened block by block, the same products and
  // float32 sums in another order); empty on the type's own products.
  std::optional<WidenedWeight> widened_weight_;
  int64_t vocab_block_;
  bool reduced_ = false;
};

}  // namespace fuseops::detail
