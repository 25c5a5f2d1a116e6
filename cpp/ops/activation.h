#pragma once
// Internal pieces of the activation ops (gelu, silu, bias_gelu) shared by
// their backends, and the activation choice the gated ops reuse.

#include <functional>
#include <initializer_list>
#include <string_view>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "ops/cpu/dispatch.h"

namespace fuseops::detail {

enum class Activation { Silu, GeluErf, GeluTanh };

// The GELU form named by an `approximate` argument ("none" or "tanh"); any
// other string is an error naming `op`.
Activation parse_gelu_approximate(const char* op, std::string_view approximate);

// Elementwise kernels: contiguous tensors of one shape and dtype, outputs
// already allocated.
using ActivationKernel = void (*)(const at::Tensor& out, const at::Tensor& input,
                                  Activation activation);
using ActivationBackwardKernel = void (*)(const at::Tensor& grad_input,
                                          const at::Tensor& grad_output,
                                          const at::Tensor& input, Activation activation);

// bias_gelu kernels: contiguous `input`/`out`/`grad_*` viewed as rows of
// bias.numel() elements, contiguous 1-D `bias`.
using BiasGeluKernel = void (*)(const at::Tensor& out, const at::Tensor& input,
                                const at::Tensor& bias, Activation activation);
using BiasGeluBackwardKernel = void (*)(const at::Tensor& grad_input,
                                        const at::Tensor& grad_bias,
                                        const at::Tensor& grad_output,
                                        const at::Tensor& input, const at::Tensor& bias,
                                        Activation activation);

// Checks, layout and allocation common to every backend; `kernel` fills the
// outputs (nullptr for the Meta backend, which only needs shapes). `op` names
// the op in error messages.
at::Tensor activation_with(const char* op, const at::Tensor& input, Activation activation,
                           ActivationKernel kernel);
at::Tensor& activation_out_with(const char* op, const at::Tensor& input,
                                Activation activation, at::Tensor& out,
                                ActivationKernel kernel);
at::Tensor activation_backward_with(const char* op, const at::Tensor& grad_output,
                                    const at::Tensor& input, Activation activation,
                                    ActivationBackwardKernel kernel);

at::Tensor bias_gelu_with(const at::Tensor& input, const at::Tensor& bias,
                          std::string_view approximate, BiasGeluKernel kernel);
at::Tensor& bias_gelu_out_with(const at::Tensor& input, const at::Tensor& bias,
                               std::string_view approximate, at::Tensor& out,
                               BiasGeluKernel kernel);
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_with(const at::Tensor& grad_output,
                                                           const at::Tensor& input,
                                                           const at::Tensor& bias,
                                                           std::string_view approximate,
                                                           BiasGeluBackwardKernel kernel);

// Fills a caller's `out` with `fill(target)`: straight into `out` when
// writes_directly(out, same_index, inputs) (ops/common/checks.h) allows it,
// else into a temporary copied over afterwards.
void fill_out(at::Tensor& out, std::initializer_list<at::Tensor> same_index,
              std::initializer_list<at::Tensor> inputs,
              const std::function<void(const at::Tensor&)>& fill);

}  // namespace fuseops::detail

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(activation_kernel, detail::ActivationKernel);
FUSEOPS_DECLARE_CPU_KERNEL(activation_backward_kernel, detail::ActivationBackwardKernel);
FUSEOPS_DECLARE_CPU_KERNEL(bias_gelu_kernel, detail::BiasGeluKernel);
FUSEOPS_DECLARE_CPU_KERNEL(bias_gelu_backward_kernel, detail::BiasGeluBackwardKernel);
}  // namespace fuseops::cpu
