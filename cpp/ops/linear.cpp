// fuseops::linear: the C++ API, the shared checks and the `*_with` entry points
// that every backend's kernels go through. The schemas and the Meta, CPU and
// CUDA registrations are generated from cpp/ops/linear.yaml. CPU kernels:
// cpp/ops/cpu/linear_kernel.cpp; CUDA: cuda/linear_kernel.cu; autograd:
// cpp/ops/autograd/linear.cpp.

#include "ops/linear.h"

#include <vector>

#include <torch/library.h>

#include <fuseops/linear.h>

#include "ops/common/autocast.h"
#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/output_memory.h"
#include "ops/common/widened_products.h"
#include "ops/common/tensors.h"

namespace fuseops {
namespace detail {
namespace {

constexpr const char* kOp = "fuseops::linear";

}  // namespace

bool linear_runs_widened(const at::Tensor& weight, int64_t rows) {
  return rows >= kLinearWidenedRows && products_widened(weight);
}

at::Tensor linear_with(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias_opt, LinearKernel kernel) {
  check_floating_input(kOp, "input", input);
  check_floating_input(kOp, "weight", weight);
  TORCH_CHECK(input.dim() >= 1, kOp,
              ": argument 'input' must have at least 1 dimension (the input features), got a "
              "0-dimensional tensor");
  TORCH_CHECK(weight.dim() == 2, kOp,
              ": argument 'weight' must be 2-D [out_features, in_features], got shape ",
              weight.sizes());
  check_same_dtype(kOp, "weight", weight, "input", input);
  check_same_device(kOp, "weight", weight, "input", input);
  const int64_t k = input.size(-1);
  const int64_t n = weight.size(0);
  TORCH_CHECK(weight.size(1) == k, kOp, ": argument 'weight' must have ", k,
              " columns (the last dimension of 'input'), got shape ", weight.sizes());
  const at::Tensor bias = undefined_if_none(bias_opt);
  if (bias.defined()) {
    check_floating_input(kOp, "bias", bias);
    check_same_dtype(kOp, "bias", bias, "input", input);
    check_same_device(kOp, "bias", bias, "input", input);
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == n, kOp, ": argument 'bias' must have shape [", n,
                "] (the rows of 'weight'), got ", bias.sizes());
  }
  std::vector<int64_t> sizes(input.sizes().begin(), input.sizes().end());
  sizes.back() = n;
  at::Tensor out = empty_output(sizes, input.options());
  if (kernel == nullptr || out.numel() == 0) {
    return out;
  }
  if (k == 0) {
    // An empty sum: the bias, or zeros.
    return bias.defined() ? out.copy_(bias.expand_as(out)) : out.zero_();
  }
  const int64_t rows = input.numel() / k;
  kernel(out.view({rows, n}), input.reshape({rows, k}).contiguous(), weight.contiguous(),
         bias.defined() ? bias.contiguous() : bias);
  return out;
}

}  // namespace detail

at::Tensor linear(const at::Tensor& input, const at::Tensor& weight,
                  const std::optional<at::Tensor>& bias) {
  check_floating_input(detail::kOp, "input", input);
  check_floating_input(detail::kOp, "weight", weight);
  static auto handle = detail::find_op<decltype(linear)>(detail::kOp);
  return handle.call(input, weight, detail::none_if_undefined(bias));
}

// torch casts linear to the autocast dtype on both devices.
FUSEOPS_AUTOCAST(linear, kLowerPrecision, kLowerPrecision)

}  // namespace fuseops
