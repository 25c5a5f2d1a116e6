#pragma once
// Internal pieces of the layer_norm op shared by its backends.

#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "ops/cpu/dispatch.h"

namespace fuseops::detail {

// Kernels receive contiguous tensors: input [rows, H], weight and bias [H] or
// undefined, outputs already allocated. `mean` and `rstd` ([rows], float32 or
// float64 for float64 input) are undefined when the caller does not need them.
using LayerNormKernel = void (*)(const at::Tensor& out, const at::Tensor& mean,
                                 const at::Tensor& rstd, const at::Tensor& input,
                                 const at::Tensor& weight, const at::Tensor& bias,
                                 double eps);
// grad_weight and grad_bias ([H], input's dtype) are reduced over all rows by
// the same pass that writes grad_input. Called with rows > 0 and H > 0 only.
using LayerNormBackwardKernel = void (*)(const at::Tensor& grad_input,
                                         const at::Tensor& grad_weight,
                                         const at::Tensor& grad_bias,
                                         const at::Tensor& grad_output,
                                         const at::Tensor& input,
                                         const at::Tensor& weight,
                                         const at::Tensor& mean,
                                         const at::Tensor& rstd);

// Checks, layout and allocation common to every backend; `kernel` fills the
// outputs (nullptr for the Meta backend, which only needs shapes).
at::Tensor layer_norm_with(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, double eps,
                           LayerNormKernel kernel);
at::Tensor& layer_norm_out_with(const at::Tensor& input,
                                const std::optional<at::Tensor>& weight,
                                const std::optional<at::Tensor>& bias, double eps,
                                at::Tensor& out, LayerNormKernel kernel);
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_forward_with(
    const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps, LayerNormKernel kernel);
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_with(
    const at::Tensor& grad_output, const at::Tensor& input,
    const std::optional<at::Tensor>& weight, const at::Tensor& mean,
    const at::Tensor& rstd, LayerNormBackwardKernel kernel);

}  // namespace fuseops::detail

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(layer_norm_kernel, detail::LayerNormKernel);
FUSEOPS_DECLARE_CPU_KERNEL(layer_norm_backward_kernel, detail::LayerNormBackwardKernel);
}  // namespace fuseops::cpu
