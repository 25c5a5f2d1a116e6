// The 2:4 sparse ops are inference ops without a derivative, under the int8
// ops' policy: their Autograd kernels refuse a call that would record a
// gradient (cpp/ops/autograd/no_derivative.h), instead of returning results
// whose gradient would silently be None; otherwise they run the device
// kernel.

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <fuseops/sparse_2_4.h>

#include "ops/autograd/no_derivative.h"

namespace fuseops {
namespace {

using autograd_detail::check_inference;

at::Tensor prune_2_4_autograd(const at::Tensor& weight) {
  check_inference("fuseops::prune_2_4", {weight});
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fuseops::prune_2_4(weight);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_2_4_autograd(
    const at::Tensor& weight, const std::optional<at::Tensor>& scale) {
  check_inference("fuseops::pack_2_4", {weight, scale});
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fuseops::pack_2_4(weight, scale);
}

at::Tensor sparse_2_4_linear_autograd(const at::Tensor& input, const at::Tensor& values,
                                      const at::Tensor& meta, const at::Tensor& scale,
                                      const std::optional<at::Tensor>& bias) {
  check_inference("fuseops::sparse_2_4_linear", {input, values, meta, scale, bias});
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fuseops::sparse_2_4_linear(input, values, meta, scale, bias);
}

at::Tensor sparse_2_4_dynamic_linear_autograd(const at::Tensor& input, const at::Tensor& values,
                                              const at::Tensor& meta, const at::Tensor& scale,
                                              const at::Tensor& colsum,
                                              const std::optional<at::Tensor>& bias) {
  check_inference("fuseops::sparse_2_4_dynamic_linear", {input, values, meta, scale, colsum, bias});
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fuseops::sparse_2_4_dynamic_linear(input, values, meta, scale, colsum, bias);
}

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  m.impl("prune_2_4", TORCH_FN(prune_2_4_autograd));
  m.impl("pack_2_4", TORCH_FN(pack_2_4_autograd));
  m.impl("sparse_2_4_linear", TORCH_FN(sparse_2_4_linear_autograd));
  m.impl("sparse_2_4_dynamic_linear", TORCH_FN(sparse_2_4_dynamic_linear_autograd));
}

}  // namespace fuseops
