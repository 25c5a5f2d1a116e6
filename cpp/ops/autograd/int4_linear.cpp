// The int4 linear ops are inference ops without a derivative. Their
// Autograd kernels refuse a call that would record a gradient, under the
// project's one policy (cpp/ops/autograd/no_derivative.h), instead of
// returning results whose gradient would silently be None; otherwise they
// run the device kernel.

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <fuseops/int4_linear.h>

#include "ops/autograd/no_derivative.h"

namespace fuseops {
namespace {

using autograd_detail::check_inference;

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_per_group_int4_autograd(
    const at::Tensor& weight, int64_t group_size, bool symmetric) {
  check_inference("fuseops::quantize_per_group_int4", {weight});
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fuseops::quantize_per_group_int4(weight, group_size, symmetric);
}

std::tuple<at::Tensor, at::Tensor> pack_int4_weight_autograd(const at::Tensor& wq,
                                                             const at::Tensor& scale,
                                                             const at::Tensor& zero,
                                                             int64_t group_size) {
  check_inference("fuseops::pack_int4_weight", {wq, scale, zero});
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fuseops::pack_int4_weight(wq, scale, zero, group_size);
}

at::Tensor int4_weight_only_linear_autograd(const at::Tensor& input, const at::Tensor& packed,
                                            const at::Tensor& scale_zero, int64_t group_size,
                                            const std::optional<at::Tensor>& bias) {
  check_inference("fuseops::int4_weight_only_linear", {input, packed, scale_zero, bias});
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fuseops::int4_weight_only_linear(input, packed, scale_zero, group_size, bias);
}

at::Tensor int4_dynamic_linear_autograd(const at::Tensor& input, const at::Tensor& packed,
                                        const at::Tensor& scale_zero, int64_t group_size,
                                        const std::optional<at::Tensor>& bias) {
  check_inference("fuseops::int4_dynamic_linear", {input, packed, scale_zero, bias});
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fuseops::int4_dynamic_linear(input, packed, scale_zero, group_size, bias);
}

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  m.impl("quantize_per_group_int4", TORCH_FN(quantize_per_group_int4_autograd));
  m.impl("pack_int4_weight", TORCH_FN(pack_int4_weight_autograd));
  m.impl("int4_weight_only_linear", TORCH_FN(int4_weight_only_linear_autograd));
  m.impl("int4_dynamic_linear", TORCH_FN(int4_dynamic_linear_autograd));
}

}  // namespace fuseops
