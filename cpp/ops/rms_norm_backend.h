#pragma once
// The dispatcher entry points of rms_norm and fused_add_rms_norm for one
// backend, built from its kernels: every backend shares the checks, layout
// and allocation of ops/rms_norm.h. Kept apart from ops/rms_norm.h so that
// the CPU kernel files need not include torch/library.h.

#include <torch/library.h>

#include "ops/rms_norm.h"

namespace fuseops::detail {

// The dispatcher entry points of one backend. `Kernels::forward()` and
// `Kernels::backward()` return its kernels (nullptr for Meta).
template <typename Kernels>
struct RmsNormBackend {
  static at::Tensor rms_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                             std::optional<double> eps) {
    return rms_norm_with(input, weight, eps, Kernels::forward());
  }
  static void rms_norm_out(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                           std::optional<double> eps, at::Tensor& out) {
    rms_norm_out_with(input, weight, eps, out, Kernels::forward());
  }
  static std::tuple<at::Tensor, at::Tensor> rms_norm_forward(
      const at::Tensor& input, const std::optional<at::Tensor>& weight,
      std::optional<double> eps) {
    return rms_norm_forward_with(input, weight, eps, Kernels::forward());
  }
  static std::tuple<at::Tensor, at::Tensor> rms_norm_backward(
      const at::Tensor& grad_output, const at::Tensor& input,
      const std::optional<at::Tensor>& weight, const at::Tensor& rstd) {
    return rms_norm_backward_with(grad_output, input, weight, rstd, Kernels::backward());
  }
  static std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(
      const at::Tensor& input, const at::Tensor& residual,
      const std::optional<at::Tensor>& weight, std::optional<double> eps) {
    return fused_add_rms_norm_with(input, residual, weight, eps, Kernels::forward());
  }
  static void fused_add_rms_norm_out(const at::Tensor& input, const at::Tensor& residual,
                                     const std::optional<at::Tensor>& weight,
                                     std::optional<double> eps, at::Tensor& out,
                                     at::Tensor& residual_out) {
    fused_add_rms_norm_out_with(input, residual, weight, eps, out, residual_out,
                                Kernels::forward());
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_forward(
      const at::Tensor& input, const at::Tensor& residual,
      const std::optional<at::Tensor>& weight, std::optional<double> eps) {
    return fused_add_rms_norm_forward_with(input, residual, weight, eps, Kernels::forward());
  }
  static std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_backward(
      const at::Tensor& grad_output, const std::optional<at::Tensor>& grad_new_residual,
      const at::Tensor& new_residual, const std::optional<at::Tensor>& weight,
      const at::Tensor& rstd) {
    return fused_add_rms_norm_backward_with(grad_output, grad_new_residual, new_residual,
                                            weight, rstd, Kernels::backward());
  }

  static void register_impls(torch::Library& m) {
    m.impl("rms_norm", TORCH_FN(rms_norm));
    m.impl("rms_norm.out", TORCH_FN(rms_norm_out));
    m.impl("rms_norm_forward", TORCH_FN(rms_norm_forward));
    m.impl("rms_norm_backward", TORCH_FN(rms_norm_backward));
    m.impl("fused_add_rms_norm", TORCH_FN(fused_add_rms_norm));
    m.impl("fused_add_rms_norm.out", TORCH_FN(fused_add_rms_norm_out));
    m.impl("fused_add_rms_norm_forward", TORCH_FN(fused_add_rms_norm_forward));
    m.impl("fused_add_rms_norm_backward", TORCH_FN(fused_add_rms_norm_backward));
  }
};

}  // namespace fuseops::detail
