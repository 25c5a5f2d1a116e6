#pragma once
// What the quantized linear ops ([..., K] activations x a packed [N, K]
// weight -> [..., N]: int8, int4, 2:4) share around their kernels: the bias
// checks and the output, and the calls that need no kernel.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "ops/common/checks.h"
#include "ops/common/output_memory.h"

namespace fuseops::detail {

// The output [..., N] of `op` for `input` [..., K], after checking the bias
// `b` (undefined, or [N] in input's dtype and on its device; `n_from` names
// the argument N was read from).
inline at::Tensor linear_output(const char* op, const at::Tensor& input, const at::Tensor& b,
                                int64_t n, const char* n_from) {
  if (b.defined()) {
    check_same_dtype(op, "bias", b, "input", input);
    check_same_device(op, "bias", b, "input", input);
    TORCH_CHECK(b.dim() == 1 && b.size(0) == n, op, ": argument 'bias' must have shape [", n,
                "] (N, from '", n_from, "'), got ", b.sizes());
  }
  std::vector<int64_t> out_shape(input.sizes().begin(), input.sizes().end());
  out_shape.back() = n;
  return empty_output(out_shape, input.options());
}

// Whether `out` still needs the kernel (there is one: not Meta); fills it
// when it does not: nothing to compute, or K = 0, an empty sum, the bias
// alone.
inline bool linear_needs_kernel(const at::Tensor& out, const at::Tensor& b, int64_t k,
                                bool has_kernel) {
  if (!has_kernel || out.numel() == 0) {
    return false;
  }
  if (k == 0) {
    if (b.defined()) {
      out.copy_(b.expand(out.sizes()));
    } else {
      out.zero_();
    }
    return false;
  }
  return true;
}

}  // namespace fuseops::detail
