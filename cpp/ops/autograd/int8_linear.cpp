// The int8 linear ops are inference ops without a derivative. Their
// Autograd kernels refuse a call that would record a gradient, under the
// project's one policy (cpp/ops/autograd/no_derivative.h), instead of
// returning results whose gradient would silently be None; otherwise they
// run the device kernel.

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <fuseops/int8_linear.h>

#include "ops/autograd/no_derivative.h"

namespace fuseops {
namespace {

using autograd_detail::check_inference;

std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_int8_weight_autograd(const at::Tensor& wq,
                                                                         const at::Tensor& scale) {
  check_inference("fuseops::pack_int8_weight", {wq, scale});
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fuseops::pack_int8_weight(wq, scale);
}

at::Tensor int8_weight_only_linear_autograd(const at::Tensor& input, const at::Tensor& packed,
                                            const at::Tensor& scale,
                                            const std::optional<at::Tensor>& bias) {
  check_inference("fuseops::int8_weight_only_linear", {input, packed, scale, bias});
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fuseops::int8_weight_only_linear(input, packed, scale, bias);
}

at::Tensor int8_dynamic_linear_autograd(const at::Tensor& input, const at::Tensor& packed,
                                        const at::Tensor& scale, const at::Tensor& colsum,
                                        const std::optional<at::Tensor>& bias) {
  check_inference("fuseops::int8_dynamic_linear", {input, packed, scale, colsum, bias});
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fuseops::int8_dynamic_linear(input, packed, scale, colsum, bias);
}

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  m.impl("pack_int8_weight", TORCH_FN(pack_int8_weight_autograd));
  m.impl("int8_weight_only_linear", TORCH_FN(int8_weight_only_linear_autograd));
  m.impl("int8_dynamic_linear", TORCH_FN(int8_dynamic_linear_autograd));
}

}  // namespace fuseops
