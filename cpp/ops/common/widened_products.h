#pragma once
// Matrix products of bfloat16/float16 operands computed in float32 on
// operands widened block by block: what the ops whose products are a linear
// layer's (linear, the fused linear losses) run on CPUs where ATen emulates
// the type (reduced_gemms.h). There a bfloat16 GEMM takes 4-5x the time of
// the float32 one, float16 7-300x, while widening costs one pass over each
// operand. The results are the exact products of the inputs summed in
// float32, as ATen's are, in another order of the sums.
//
// The weight [N, K] is widened a block of rows at a time into one reused
// buffer (at most 8 Mi floats, 32 MiB), so that no float32 copy of a large
// weight (an LM head) exists; the activations, a few rows' worth, are
// widened whole.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace fuseops::detail {

// Whether products of `weight` (a CPU tensor of a dtype ATen emulates:
// reduced_gemms.h) run widened. The ops that use this module decide by it,
// linear also by the number of rows.
bool products_widened(const at::Tensor& weight);

// A bfloat16/float16 weight [N, K] (contiguous), widened to float32 a block
// of rows at a time.
class WidenedWeight {
 public:
  // `rows` is the number of activation rows the products take (the size of
  // the blocks of logits/gradients that go with a weight block).
  WidenedWeight(const at::Tensor& weight, int64_t rows);

  // Rows per block.
  int64_t block_rows() const { return block_rows_; }

  // Rows [n0, n0 + count) of the weight in float32 (count <= block_rows();
  // valid until the next call).
  at::Tensor rows(int64_t n0, int64_t count);

  const at::Tensor& weight() const { return weight_; }

 private:
  at::Tensor weight_;
  at::Tensor buffer_;
  int64_t block_rows_;
};

// out [M, N] (any strides, the weight's dtype) = x [M, K] @ weight^T
// (+ bias [N]).
void widened_linear(const at::Tensor& out, const at::Tensor& x, WidenedWeight& weight,
                    const at::Tensor& bias);

// The gradients of widened_linear for grad [M, N] (any strides):
// grad_input [M, K] = grad @ weight, written (in its dtype; undefined: not
// computed); grad_weight [N, K] = grad^T @ x, added to it when it is a
// float32 accumulator (`accumulate`), else written; grad_bias [N] (float32)
// += grad's column sums (undefined: not computed).
void widened_linear_backward(const at::Tensor& grad, const at::Tensor& x, WidenedWeight& weight,
                             const at::Tensor& grad_input, const at::Tensor& grad_weight,
                             bool accumulate, const at::Tensor& grad_bias);

}  // namespace fuseops::detail
