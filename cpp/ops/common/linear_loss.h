#pragma once
// What the losses fused with their linear layer (linear_cross_entropy,
// fused_linear_jsd) share: they run the rows in chunks whose logits are
// formed, turned into the loss and their gradient, and dropped, so that
// [N, V] logits never exist; the weight's gradient accumulates over the
// chunks in the computation dtype.

#include <algorithm>
#include <cstdint>

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>

#include "ops/common/output_memory.h"

namespace fuseops::detail {

// What the gradients of a fused linear loss are taken for: none, a
// grad_output of 1 (ones per row for reduction "none"), or the given
// grad_output of the loss's shape (the recomputing backward).
enum class LinearLossGradient { None, OfOne, OfGradOutput };

// The rows per chunk for `rows` rows of `hidden` inputs and `vocab` classes:
// a chunk's logits take about as much memory as the input (at least 64
// rows, to keep the GEMMs efficient). bfloat16/float16 chunks are 4 times
// that: each chunk adds its weight gradient to the float32 accumulator in a
// pass over [V, H], which fewer chunks make cheaper.
inline int64_t linear_loss_chunk_rows(int64_t rows, int64_t hidden, int64_t vocab, bool reduced) {
  const int64_t chunk_scale = reduced ? 4 : 1;
  return std::min(rows, std::max<int64_t>(64, chunk_scale * ((rows * hidden + vocab - 1) /
                                                             std::max<int64_t>(vocab, 1))));
}

// Accumulates the gradients of a linear layer's weight ([V, H]) and bias
// ([V], optional) over chunks of rows, in the computation dtype (float32 for
// bfloat16/float16, which `finish` writes back into the outputs).
class LinearGradAccumulator {
 public:
  // `grad_weight` and `grad_bias` (undefined without a bias) are the outputs.
  LinearGradAccumulator(const at::Tensor& grad_weight, const at::Tensor& grad_bias)
      : grad_weight_(grad_weight), grad_bias_(grad_bias) {
    const at::ScalarType opmath = at::toOpMathType(grad_weight.scalar_type());
    reduced_ = opmath != grad_weight.scalar_type();
    const auto opmath_options = grad_weight.options().dtype(opmath);
    const int64_t vocab = grad_weight.size(0);
    weight_acc_ =
        reduced_ ? empty_output(grad_weight.sizes(), opmath_options).zero_() : grad_weight.zero_();
    if (reduced_) {
      weight_block_ =
          empty_output({std::min(kVocabBlock, vocab), grad_weight.size(1)}, grad_weight.options());
    }
    if (grad_bias.defined()) {
      bias_acc_ = reduced_ ? empty_output({vocab}, opmath_options).zero_() : grad_bias.zero_();
    }
  }

  // Adds grad_logits^T @ x (and the column sums of grad_logits to the bias'):
  // `grad_logits` [n, V], `x` [n, H].
  void add(const at::Tensor& grad_logits, const at::Tensor& x) {
    const int64_t vocab = grad_weight_.size(0);
    if (reduced_) {
      // bfloat16/float16 GEMMs (float32 sums inside, 2-3x the speed of
      // float32 GEMMs on CPUs with bfloat16 instructions) into a small
      // block, added to the float32 accumulator block by block.
      for (int64_t v0 = 0; v0 < vocab; v0 += kVocabBlock) {
        const int64_t vb = std::min(kVocabBlock, vocab - v0);
        at::Tensor block = weight_block_.narrow(0, 0, vb);
        at::mm_out(block, grad_logits.narrow(1, v0, vb).t(), x);
        weight_acc_.narrow(0, v0, vb).add_(block);
      }
    } else {
      weight_acc_.addmm_(grad_logits.t(), x);
    }
    if (bias_acc_.defined()) {
      bias_acc_.add_(at::sum(grad_logits, {0}, false, bias_acc_.scalar_type()));
    }
  }

  // Writes the accumulated gradients into the outputs.
  void finish() {
    if (reduced_) {
      grad_weight_.copy_(weight_acc_);
      if (bias_acc_.defined()) {
        grad_bias_.copy_(bias_acc_);
      }
    }
  }

 private:
  static constexpr int64_t kVocabBlock = 4096;
  at::Tensor grad_weight_;
  at::Tensor grad_bias_;
  at::Tensor weight_acc_;
  at::Tensor weight_block_;
  at::Tensor bias_acc_;
  bool reduced_ = false;
};

}  // namespace fuseops::detail
