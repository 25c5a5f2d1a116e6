#pragma once
// layer_norm's contract between its shared entry points and its kernels
// (see ops/relu.h).

#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "ops_generated/layer_norm.h"

namespace fuseops::detail {

// Kernels receive contiguous tensors: input [rows, H], weight and bias [H] or
// undefined, outputs already allocated. `mean` and `rstd` ([rows], float32 or
// float64 for float64 input) are undefined when the caller does not need them.
using LayerNormKernel = void (*)(const at::Tensor& out, const at::Tensor& mean,
                                 const at::Tensor& rstd, const at::Tensor& input,
                                 const at::Tensor& weight, const at::Tensor& bias, double eps);
// grad_weight and grad_bias ([H], input's dtype) are reduced over all rows by
// the same pass that writes grad_input. Called with rows > 0 and H > 0 only.
using LayerNormBackwardKernel = void (*)(const at::Tensor& grad_input,
                                         const at::Tensor& grad_weight, const at::Tensor& grad_bias,
                                         const at::Tensor& grad_output, const at::Tensor& input,
                                         const at::Tensor& weight, const at::Tensor& mean,
                                         const at::Tensor& rstd);

// Checks, layout and allocation common to every backend; `kernel` fills the
// outputs (nullptr for the Meta backend, which only needs shapes).
at::Tensor layer_norm_with(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, double eps,
                           LayerNormKernel kernel);
at::Tensor& layer_norm_out_with(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                const std::optional<at::Tensor>& bias, double eps, at::Tensor& out,
                                LayerNormKernel kernel);
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_forward_with(
    const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps, LayerNormKernel kernel);
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_with(
    const at::Tensor& grad_output, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const at::Tensor& mean, const at::Tensor& rstd, LayerNormBackwardKernel kernel);
void layer_norm_backward_out_with(const at::Tensor& grad_output, const at::Tensor& input,
                                  const std::optional<at::Tensor>& weight, const at::Tensor& mean,
                                  const at::Tensor& rstd, at::Tensor& grad_input,
                                  at::Tensor& grad_weight, at::Tensor& grad_bias,
                                  LayerNormBackwardKernel kernel);

// The dispatcher entry points of one backend, whose `Kernels::forward()` and
// `Kernels::backward()` return its kernels.
template <typename Kernels>
struct LayerNormRegistrations {
  using TensorTriple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

  static at::Tensor layer_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps) {
    return layer_norm_with(input, weight, bias, eps, Kernels::forward());
  }
  static void layer_norm_out(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                             const std::optional<at::Tensor>& bias, double eps, at::Tensor& out) {
    layer_norm_out_with(input, weight, bias, eps, out, Kernels::forward());
  }
  static TensorTriple layer_norm_forward(const at::Tensor& input,
                                         const std::optional<at::Tensor>& weight,
                                         const std::optional<at::Tensor>& bias, double eps) {
    return layer_norm_forward_with(input, weight, bias, eps, Kernels::forward());
  }
  static TensorTriple layer_norm_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                          const std::optional<at::Tensor>& weight,
                                          const at::Tensor& mean, const at::Tensor& rstd) {
    return layer_norm_backward_with(grad_output, input, weight, mean, rstd, Kernels::backward());
  }
  static void layer_norm_backward_out(const at::Tensor& grad_output, const at::Tensor& input,
                                      const std::optional<at::Tensor>& weight,
                                      const at::Tensor& mean, const at::Tensor& rstd,
                                      at::Tensor& grad_input, at::Tensor& grad_weight,
                                      at::Tensor& grad_bias) {
    layer_norm_backward_out_with(grad_output, input, weight, mean, rstd, grad_input, grad_weight,
                                 grad_bias, Kernels::backward());
  }

  // The operators of cpp/ops/layer_norm.yaml's `ops:`, each with the function of
  // the same name.
  template <typename Library>
  static void register_all(Library& m) {
    register_layer_norm_kernels<LayerNormRegistrations>(m);
  }
};

}  // namespace fuseops::detail
