// The products of the losses fused with their linear layer; why the
// products may run widened is in linear_loss.h.

#include "ops/common/linear_loss.h"

#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>

#include "ops/common/widened_products.h"

namespace fuseops::detail {
namespace {

// The rows of the blocks of the native bfloat16/float16 weight gradient:
// at most 8 Mi elements.
int64_t vocab_block_rows(int64_t vocab, int64_t hidden) {
  constexpr int64_t kMaxFloats = int64_t{1} << 23;
  const int64_t rows = std::clamp<int64_t>(kMaxFloats / std::max<int64_t>(hidden, 1), 64, 4096);
  return std::max<int64_t>(std::min(rows, vocab), 1);
}

}  // namespace

LinearLossHead::LinearLossHead(const at::Tensor& weight, const at::Tensor& bias,
                               const at::Tensor& grad_weight, const at::Tensor& grad_bias)
    : weight_(weight),
      bias_(bias),
      grad_weight_(grad_weight),
      grad_bias_(grad_bias),
      vocab_block_(vocab_block_rows(weight.size(0), weight.size(1))) {
  const at::ScalarType opmath = at::toOpMathType(weight.scalar_type());
  reduced_ = opmath != weight.scalar_type();
  const auto opmath_options = weight.options().dtype(opmath);
  const int64_t vocab = weight.size(0);
  if (products_widened(weight)) {
    widened_weight_.emplace(weight, 0);
  }
  if (!grad_weight.defined()) {
    return;
  }
  weight_acc_ =
      reduced_ ? empty_output(grad_weight.sizes(), opmath_options).zero_() : grad_weight.zero_();
  if (reduced_ && !widened_weight_) {
    weight_block_ = empty_output({vocab_block_, grad_weight.size(1)}, grad_weight.options());
  }
  if (grad_bias.defined()) {
    bias_acc_ = reduced_ ? empty_output({vocab}, opmath_options).zero_() : grad_bias.zero_();
  }
}

void LinearLossHead::logits(const at::Tensor& out, const at::Tensor& x) {
  at::Tensor logits = out;
  if (!widened_weight_) {
    if (bias_.defined()) {
      at::addmm_out(logits, bias_, x, weight_.t());
    } else {
      at::mm_out(logits, x, weight_.t());
    }
    return;
  }
  widened_linear(logits, x, *widened_weight_, bias_);
}

void LinearLossHead::backward(const at::Tensor& grad_logits, const at::Tensor& x,
                              const at::Tensor& grad_input) {
  const int64_t vocab = weight_.size(0);
  if (!widened_weight_) {
    at::Tensor grad_input_rows = grad_input;
    at::mm_out(grad_input_rows, grad_logits, weight_);
    if (!weight_acc_.defined()) {
      return;  // a head without gradients
    }
    if (reduced_) {
      // bfloat16/float16 GEMMs (float32 sums inside, 2-3x the speed of
      // float32 GEMMs on CPUs with bfloat16 instructions) into a small
      // block, added to the float32 accumulator block by block.
      for (int64_t v0 = 0; v0 < vocab; v0 += vocab_block_) {
        const int64_t rows = std::min(vocab_block_, vocab - v0);
        at::Tensor block = weight_block_.narrow(0, 0, rows);
        at::mm_out(block, grad_logits.narrow(1, v0, rows).t(), x);
        weight_acc_.narrow(0, v0, rows).add_(block);
      }
    } else {
      weight_acc_.addmm_(grad_logits.t(), x);
    }
    if (bias_acc_.defined()) {
      bias_acc_.add_(at::sum(grad_logits, {0}, false, bias_acc_.scalar_type()));
    }
    return;
  }
  // Widened: every product in float32, block by block of the vocabulary;
  // the weight's gradient added straight into its float32 accumulator.
  widened_linear_backward(grad_logits, x, *widened_weight_, grad_input, weight_acc_,
                          /*accumulate=*/true, bias_acc_);
}

void LinearLossHead::finish() {
  if (reduced_ && weight_acc_.defined()) {
    grad_weight_.copy_(weight_acc_);
    if (bias_acc_.defined()) {
      grad_bias_.copy_(bias_acc_);
    }
  }
}

}  // namespace fuseops::detail
