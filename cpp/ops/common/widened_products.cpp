// Why and how the products run widened is in widened_products.h.

#include "ops/common/widened_products.h"

#include <algorithm>

#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>

#include "ops/common/output_memory.h"
#include "ops/common/reduced_gemms.h"

namespace fuseops::detail {
namespace {

// At most 8 Mi floats (32 MiB) in a widened weight block and in the
// [M, rows] block of logits or gradients that goes with it; at least 64 rows,
// to keep the GEMMs efficient.
int64_t weight_block_rows(int64_t n, int64_t k, int64_t m) {
  constexpr int64_t kMaxFloats = int64_t{1} << 23;
  const int64_t rows = std::clamp<int64_t>(kMaxFloats / std::max<int64_t>({k, m, 1}), 64, 4096);
  return std::max<int64_t>(std::min(rows, n), 1);
}

}  // namespace

bool products_widened(const at::Tensor& weight) {
  return weight.device().type() == c10::DeviceType::CPU &&
         reduced_gemms_emulated(weight.scalar_type());
}

WidenedWeight::WidenedWeight(const at::Tensor& weight, int64_t rows)
    : weight_(weight), block_rows_(weight_block_rows(weight.size(0), weight.size(1), rows)) {
  buffer_ = empty_output({block_rows_, weight.size(1)}, weight.options().dtype(at::kFloat));
}

at::Tensor WidenedWeight::rows(int64_t n0, int64_t count) {
  return buffer_.narrow(0, 0, count).copy_(weight_.narrow(0, n0, count));
}

void widened_linear(const at::Tensor& out, const at::Tensor& x, WidenedWeight& weight,
                    const at::Tensor& bias) {
  const int64_t m = x.size(0);
  const int64_t n = weight.weight().size(0);
  const at::Tensor x_float = x.to(at::kFloat);
  const at::Tensor block_buffer = empty_output({m * weight.block_rows()}, x_float.options());
  for (int64_t n0 = 0; n0 < n; n0 += weight.block_rows()) {
    const int64_t rows = std::min(weight.block_rows(), n - n0);
    at::Tensor block = block_buffer.narrow(0, 0, m * rows).view({m, rows});
    const at::Tensor w = weight.rows(n0, rows);
    if (bias.defined()) {
      at::addmm_out(block, bias.narrow(0, n0, rows).to(at::kFloat), x_float, w.t());
    } else {
      at::mm_out(block, x_float, w.t());
    }
    out.narrow(1, n0, rows).copy_(block);
  }
}

void widened_linear_backward(const at::Tensor& grad, const at::Tensor& x, WidenedWeight& weight,
                             const at::Tensor& grad_input, const at::Tensor& grad_weight,
                             bool accumulate, const at::Tensor& grad_bias) {
  const int64_t n = weight.weight().size(0);
  const at::Tensor x_float = grad_weight.defined() ? x.to(at::kFloat) : at::Tensor();
  const at::Tensor grad_input_float =
      grad_input.defined() ? at::zeros(grad_input.sizes(), grad.options().dtype(at::kFloat))
                           : at::Tensor();
  at::Tensor weight_block;
  if (grad_weight.defined() && !accumulate) {
    weight_block = empty_output({weight.block_rows(), grad_weight.size(1)}, x_float.options());
  }
  for (int64_t n0 = 0; n0 < n; n0 += weight.block_rows()) {
    const int64_t rows = std::min(weight.block_rows(), n - n0);
    const at::Tensor grad_float = grad.narrow(1, n0, rows).to(at::kFloat);
    if (grad_input_float.defined()) {
      grad_input_float.addmm_(grad_float, weight.rows(n0, rows));
    }
    if (grad_weight.defined()) {
      if (accumulate) {
        grad_weight.narrow(0, n0, rows).addmm_(grad_float.t(), x_float);
      } else {
        at::Tensor block = weight_block.narrow(0, 0, rows);
        at::mm_out(block, grad_float.t(), x_float);
        grad_weight.narrow(0, n0, rows).copy_(block);
      }
    }
    if (grad_bias.defined()) {
      grad_bias.narrow(0, n0, rows).add_(grad_float.sum(0));
    }
  }
  if (grad_input.defined()) {
    grad_input.copy_(grad_input_float);
  }
}

}  // namespace fuseops::detail
