#pragma once
// The contract of rms_norm and fused_add_rms_norm between their shared entry
// points and their kernels (see ops/relu.h).

#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "ops_generated/rms_norm.h"

namespace fuseops::detail {

// What a forward kernel computes, over rows of length input.size(-1). Every
// tensor is contiguous and already allocated; `out` and `residual_out` may
// be the very tensors `input` or `residual` (in place: each element is read
// before its slot is written). Kernels never see an empty input.
struct RmsNormForwardArgs {
  at::Tensor out;
  at::Tensor rstd;  // per row, opmath dtype; undefined: not wanted
  at::Tensor input;
  at::Tensor residual;      // fused_add_rms_norm only, else undefined
  at::Tensor residual_out;  // defined iff residual is: receives input + residual
  at::Tensor weight;        // (hidden,) in the opmath dtype (CPU: or the input's), or undefined
  double eps;
};

struct RmsNormBackwardArgs {
  at::Tensor grad_input;
  at::Tensor grad_weight;  // (hidden,) opmath, undefined without weight
  at::Tensor grad_output;
  at::Tensor grad_residual;  // added to grad_input, or undefined
  at::Tensor input;          // the normalized input (new_residual when fused)
  at::Tensor weight;         // (hidden,) opmath, or undefined
  at::Tensor rstd;           // per row, opmath
};

// The eps a call uses: the given one, else torch.nn.functional.rms_norm's
// default, the machine epsilon of input's computation dtype.
double resolve_eps(std::optional<double> eps, const at::Tensor& input);

using RmsNormForwardKernel = void (*)(const RmsNormForwardArgs& args);
using RmsNormBackwardKernel = void (*)(const RmsNormBackwardArgs& args);

// Checks, layout and allocation common to every backend; the kernel fills
// the outputs (nullptr for the Meta backend, which only needs shapes).
at::Tensor rms_norm_with(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                         std::optional<double> eps, RmsNormForwardKernel kernel);
void rms_norm_out_with(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                       std::optional<double> eps, at::Tensor& out, RmsNormForwardKernel kernel);
std::tuple<at::Tensor, at::Tensor> rms_norm_forward_with(const at::Tensor& input,
                                                         const std::optional<at::Tensor>& weight,
                                                         std::optional<double> eps,
                                                         RmsNormForwardKernel kernel);
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_with(const at::Tensor& grad_output,
                                                          const at::Tensor& input,
                                                          const std::optional<at::Tensor>& weight,
                                                          const at::Tensor& rstd,
                                                          RmsNormBackwardKernel kernel);
void rms_norm_backward_out_with(const at::Tensor& grad_output, const at::Tensor& input,
                                const std::optional<at::Tensor>& weight, const at::Tensor& rstd,
                                at::Tensor& grad_input, at::Tensor& grad_weight,
                                RmsNormBackwardKernel kernel);

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_with(const at::Tensor& input,
                                                           const at::Tensor& residual,
                                                           const std::optional<at::Tensor>& weight,
                                                           std::optional<double> eps,
                                                           RmsNormForwardKernel kernel);
void fused_add_rms_norm_out_with(const at::Tensor& input, const at::Tensor& residual,
                                 const std::optional<at::Tensor>& weight, std::optional<double> eps,
                                 at::Tensor& out, at::Tensor& residual_out,
                                 RmsNormForwardKernel kernel);
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_forward_with(
    const at::Tensor& input, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    std::optional<double> eps, RmsNormForwardKernel kernel);
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_backward_with(
    const at::Tensor& grad_output, const std::optional<at::Tensor>& grad_new_residual,
    const at::Tensor& new_residual, const std::optional<at::Tensor>& weight, const at::Tensor& rstd,
    RmsNormBackwardKernel kernel);
void fused_add_rms_norm_backward_out_with(const at::Tensor& grad_output,
                                          const std::optional<at::Tensor>& grad_new_residual,
                                          const at::Tensor& new_residual,
                                          const std::optional<at::Tensor>& weight,
                                          const at::Tensor& rstd, at::Tensor& grad_input,
                                          at::Tensor& grad_weight, RmsNormBackwardKernel kernel);

// The dispatcher entry points of one backend, whose `Kernels::forward()` and
// `Kernels::backward()` return its kernels.
template <typename Kernels>
struct RmsNormRegistrations {
  static at::Tensor rms_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                             std::optional<double> eps) {
    return rms_norm_with(input, weight, eps, Kernels::forward());
  }
  static void rms_norm_out(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                           std::optional<double> eps, at::Tensor& out) {
    rms_norm_out_with(input, weight, eps, out, Kernels::forward());
  }
  static std::tuple<at::Tensor, at::Tensor> rms_norm_forward(
      const at::Tensor& input, const std::optional<at::Tensor>& weight, std::optional<double> eps) {
    return rms_norm_forward_with(input, weight, eps, Kernels::forward());
  }
  static std::tuple<at::Tensor, at::Tensor> rms_norm_backward(
      const at::Tensor& grad_output, const at::Tensor& input,
      const std::optional<at::Tensor>& weight, const at::Tensor& rstd) {
    return rms_norm_backward_with(grad_output, input, weight, rstd, Kernels::backward());
  }
  static void rms_norm_backward_out(const at::Tensor& grad_output, const at::Tensor& input,
                                    const std::optional<at::Tensor>& weight, const at::Tensor& rstd,
                                    at::Tensor& grad_input, at::Tensor& grad_weight) {
    rms_norm_backward_out_with(grad_output, input, weight, rstd, grad_input, grad_weight,
                               Kernels::backward());
  }
  static std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(
      const at::Tensor& input, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
      std::optional<double> eps) {
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
      const at::Tensor& input, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
      std::optional<double> eps) {
    return fused_add_rms_norm_forward_with(input, residual, weight, eps, Kernels::forward());
  }
  static std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_backward(
      const at::Tensor& grad_output, const std::optional<at::Tensor>& grad_new_residual,
      const at::Tensor& new_residual, const std::optional<at::Tensor>& weight,
      const at::Tensor& rstd) {
    return fused_add_rms_norm_backward_with(grad_output, grad_new_residual, new_residual, weight,
                                            rstd, Kernels::backward());
  }
  static void fused_add_rms_norm_backward_out(const at::Tensor& grad_output,
                                              const std::optional<at::Tensor>& grad_new_residual,
                                              const at::Tensor& new_residual,
                                              const std::optional<at::Tensor>& weight,
                                              const at::Tensor& rstd, at::Tensor& grad_input,
                                              at::Tensor& grad_weight) {
    fused_add_rms_norm_backward_out_with(grad_output, grad_new_residual, new_residual, weight, rstd,
                                         grad_input, grad_weight, Kernels::backward());
  }

  // The operators of cpp/ops/rms_norm.yaml's `ops:`, each with the function of
  // the same name.
  template <typename Library>
  static void register_all(Library& m) {
    register_rms_norm_kernels<RmsNormRegistrations>(m);
  }
};

}  // namespace fuseops::detail
