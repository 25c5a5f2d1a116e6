#pragma once
// Internal pieces of rms_norm and fused_add_rms_norm shared by their
// backends (CPU, CUDA, Meta).

#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "ops/cpu/dispatch.h"

namespace fuseops::detail {

// What a forward kernel computes, over rows of length input.size(-1). Every
// tensor is contiguous and already allocated; `out` and `residual_out` may
// be the very tensors `input` or `residual` (in place: each element is read
// before its slot is written). Kernels never see an empty input.
struct RmsNormForwardArgs {
  at::Tensor out;
  at::Tensor rstd;          // per row, opmath dtype; undefined: not wanted
  at::Tensor input;
  at::Tensor residual;      // fused_add_rms_norm only, else undefined
  at::Tensor residual_out;  // defined iff residual is: receives input + residual
  at::Tensor weight;        // (hidden,) in the opmath dtype, or undefined
  double eps;
};

struct RmsNormBackwardArgs {
  at::Tensor grad_input;
  at::Tensor grad_weight;    // (hidden,) opmath, undefined without weight
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
                       std::optional<double> eps, at::Tensor& out,
                       RmsNormForwardKernel kernel);
std::tuple<at::Tensor, at::Tensor> rms_norm_forward_with(
    const at::Tensor& input, const std::optional<at::Tensor>& weight,
    std::optional<double> eps, RmsNormForwardKernel kernel);
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_with(
    const at::Tensor& grad_output, const at::Tensor& input,
    const std::optional<at::Tensor>& weight, const at::Tensor& rstd,
    RmsNormBackwardKernel kernel);

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_with(
    const at::Tensor& input, const at::Tensor& residual,
    const std::optional<at::Tensor>& weight, std::optional<double> eps,
    RmsNormForwardKernel kernel);
void fused_add_rms_norm_out_with(const at::Tensor& input, const at::Tensor& residual,
                                 const std::optional<at::Tensor>& weight,
                                 std::optional<double> eps, at::Tensor& out,
                                 at::Tensor& residual_out, RmsNormForwardKernel kernel);
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_forward_with(
    const at::Tensor& input, const at::Tensor& residual,
    const std::optional<at::Tensor>& weight, std::optional<double> eps,
    RmsNormForwardKernel kernel);
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_backward_with(
    const at::Tensor& grad_output, const std::optional<at::Tensor>& grad_new_residual,
    const at::Tensor& new_residual, const std::optional<at::Tensor>& weight,
    const at::Tensor& rstd, RmsNormBackwardKernel kernel);

}  // namespace fuseops::detail

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(rms_norm_forward_kernel, detail::RmsNormForwardKernel);
FUSEOPS_DECLARE_CPU_KERNEL(rms_norm_backward_kernel, detail::RmsNormBackwardKernel);
}  // namespace fuseops::cpu
