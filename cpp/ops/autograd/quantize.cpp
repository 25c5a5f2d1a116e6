// The int8 quantization ops are inference ops without a derivative
// (rounding has none worth propagating). Their Autograd kernels refuse a
// call that would record a gradient, under the project's one policy
// (cpp/ops/autograd/no_derivative.h), instead of returning results whose
// gradient would silently be None; otherwise they run the device kernel.

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <fuseops/quantize.h>

#include "ops/autograd/no_derivative.h"

namespace fuseops {
namespace {

using autograd_detail::check_inference;

std::tuple<at::Tensor, at::Tensor> quantize_per_channel_int8_autograd(const at::Tensor& weight) {
  check_inference("fuseops::quantize_per_channel_int8", {weight});
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fuseops::quantize_per_channel_int8(weight);
}

std::tuple<at::Tensor, at::Tensor> quantize_per_token_int8_autograd(const at::Tensor& input) {
  check_inference("fuseops::quantize_per_token_int8", {input});
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fuseops::quantize_per_token_int8(input);
}

at::Tensor dequantize_int8_autograd(const at::Tensor& q, const at::Tensor& scale, int64_t dim,
                                    std::optional<at::ScalarType> dtype) {
  check_inference("fuseops::dequantize_int8", {q, scale});
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fuseops::dequantize_int8(q, scale, dim, dtype);
}

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  m.impl("quantize_per_channel_int8", TORCH_FN(quantize_per_channel_int8_autograd));
  m.impl("quantize_per_token_int8", TORCH_FN(quantize_per_token_int8_autograd));
  m.impl("dequantize_int8", TORCH_FN(dequantize_int8_autograd));
}

}  // namespace fuseops
