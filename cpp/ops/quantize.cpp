// fuseops int8 quantization: the C++ API, the shared checks and the `*_with`
// entry points that every backend's kernels go through. The schemas and the
// Meta, CPU and CUDA registrations are generated from cpp/ops/quantize.yaml.
// CPU kernels: cpp/ops/cpu/quantize_kernel.cpp; CUDA: cuda/quantize_kernel.cu;
// autograd: none (`autograd:` in cpp/ops/quantize.yaml declares its refusals).

#include "ops/quantize.h"

#include <vector>

#include <torch/library.h>

#include <fuseops/quantize.h>

#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/output_memory.h"

namespace fuseops {
namespace detail {
namespace {

// q int8 with `input`'s shape, one float32 scale per row of the last
// dimension; the kernel fills both.
std::tuple<at::Tensor, at::Tensor> quantize_rows(const char* op, const char* arg,
                                                 const at::Tensor& input,
                                                 QuantizeRowsKernel kernel) {
  at::Tensor q = empty_output(input.sizes(), input.options().dtype(at::kChar));
  at::Tensor scale =
      empty_output(input.sizes().slice(0, input.dim() - 1), input.options().dtype(at::kFloat));
  if (kernel != nullptr && scale.numel() > 0) {
    const int64_t bad_row = kernel(q, scale, input.contiguous());
    TORCH_CHECK(bad_row < 0, op, ": argument '", arg, "' must be finite, but row ", bad_row,
                " (of ", scale.numel(), " rows of ", input.size(-1), ") holds Inf or NaN",
                input.scalar_type() == at::kDouble ? " or a value beyond float32's range" : "",
                ": its scale absmax/127 would not be finite");
  }
  return {q, scale};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> quantize_per_channel_int8_with(const at::Tensor& weight,
                                                                  QuantizeRowsKernel kernel) {
  constexpr const char* op = "fuseops::quantize_per_channel_int8";
  check_floating_input(op, "weight", weight);
  TORCH_CHECK(weight.dim() == 2, op,
              ": argument 'weight' must be 2-D [out_features, in_features], got shape ",
              weight.sizes());
  return quantize_rows(op, "weight", weight, kernel);
}

std::tuple<at::Tensor, at::Tensor> quantize_per_token_int8_with(const at::Tensor& input,
                                                                QuantizeRowsKernel kernel) {
  constexpr const char* op = "fuseops::quantize_per_token_int8";
  check_floating_input(op, "input", input);
  TORCH_CHECK(input.dim() >= 1, op,
              ": argument 'input' must have at least one dimension [..., K], got a 0-d tensor");
  return quantize_rows(op, "input", input, kernel);
}

at::Tensor dequantize_int8_with(const at::Tensor& q, const at::Tensor& scale, int64_t dim,
                                std::optional<at::ScalarType> dtype, DequantizeKernel kernel) {
  constexpr const char* op = "fuseops::dequantize_int8";
  check_defined(op, "q", q);
  check_defined(op, "scale", scale);
  TORCH_CHECK(q.scalar_type() == at::kChar, op, ": argument 'q' must have dtype int8, got ",
              q.scalar_type());
  TORCH_CHECK(scale.scalar_type() == at::kFloat, op,
              ": argument 'scale' must have dtype float32, got ", scale.scalar_type());
  check_same_device(op, "scale", scale, "q", q);
  TORCH_CHECK(q.dim() >= 1, op,
              ": argument 'q' must have at least one dimension, got a 0-d tensor");
  TORCH_CHECK(dim >= -q.dim() && dim < q.dim(), op, ": argument 'dim' must be in [", -q.dim(), ", ",
              q.dim() - 1, "] for 'q' of shape ", q.sizes(), ", got ", dim);
  const int64_t d = dim < 0 ? dim + q.dim() : dim;
  std::vector<int64_t> scale_shape(q.sizes().begin(), q.sizes().end());
  scale_shape.erase(scale_shape.begin() + d);
  TORCH_CHECK(scale.sizes() == at::IntArrayRef(scale_shape), op,
              ": argument 'scale' must have the shape of 'q' ", q.sizes(), " without dimension ", d,
              ", i.e. ", at::IntArrayRef(scale_shape), ", got ", scale.sizes());
  const at::ScalarType out_dtype = dtype.value_or(at::kFloat);
  TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kDouble || out_dtype == at::kBFloat16 ||
                  out_dtype == at::kHalf,
              op, ": argument 'dtype' must be float32, float64, bfloat16 or float16, got ",
              out_dtype);
  at::Tensor out = empty_output(q.sizes(), q.options().dtype(out_dtype));
  if (kernel != nullptr && q.numel() > 0) {
    int64_t outer = 1;
    int64_t inner = 1;
    for (int64_t i = 0; i < d; ++i) {
      outer *= q.size(i);
    }
    for (int64_t i = d + 1; i < q.dim(); ++i) {
      inner *= q.size(i);
    }
    kernel(out, q.contiguous(), scale.contiguous(), outer, q.size(d), inner);
  }
  return out;
}

}  // namespace detail

// C++ API: through the dispatcher. Undefined tensors carry no dispatch key,
// so they are rejected here with a message naming the argument.
std::tuple<at::Tensor, at::Tensor> quantize_per_channel_int8(const at::Tensor& weight) {
  check_floating_input("fuseops::quantize_per_channel_int8", "weight", weight);
  static auto op =
      detail::find_op<decltype(quantize_per_channel_int8)>("fuseops::quantize_per_channel_int8");
  return op.call(weight);
}

std::tuple<at::Tensor, at::Tensor> quantize_per_token_int8(const at::Tensor& input) {
  check_floating_input("fuseops::quantize_per_token_int8", "input", input);
  static auto op =
      detail::find_op<decltype(quantize_per_token_int8)>("fuseops::quantize_per_token_int8");
  return op.call(input);
}

at::Tensor dequantize_int8(const at::Tensor& q, const at::Tensor& scale, int64_t dim,
                           std::optional<at::ScalarType> dtype) {
  static auto op = detail::find_op<decltype(dequantize_int8)>("fuseops::dequantize_int8");
  return op.call(q, scale, dim, dtype);
}

}  // namespace fuseops
