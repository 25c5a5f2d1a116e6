#pragma once
// Dispatcher registration of the activation ops for one backend. A backend
// supplies its kernels as a struct with static functions forward(),
// backward(), bias_gelu() and bias_gelu_backward(); checks, layout and
// allocation are the shared *_with functions, so every backend behaves alike.

#include <torch/library.h>

#include "ops/activation.h"

namespace fuseops::detail {

struct MetaActivationKernels {
  static ActivationKernel forward() { return nullptr; }
  static ActivationBackwardKernel backward() { return nullptr; }
  static BiasGeluKernel bias_gelu() { return nullptr; }
  static BiasGeluBackwardKernel bias_gelu_backward() { return nullptr; }
};

template <typename Kernels>
struct ActivationRegistrations {
  static at::Tensor gelu(const at::Tensor& input, c10::string_view approximate) {
    constexpr const char* op = "fuseops::gelu";
    return activation_with(op, input, parse_gelu_approximate(op, approximate),
                           Kernels::forward());
  }
  static void gelu_out(const at::Tensor& input, c10::string_view approximate,
                       at::Tensor& out) {
    constexpr const char* op = "fuseops::gelu.out";
    activation_out_with(op, input, parse_gelu_approximate(op, approximate), out,
                        Kernels::forward());
  }
  static at::Tensor gelu_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                  c10::string_view approximate) {
    constexpr const char* op = "fuseops::gelu_backward";
    return activation_backward_with(op, grad_output, input,
                                    parse_gelu_approximate(op, approximate),
                                    Kernels::backward());
  }
  static at::Tensor silu(const at::Tensor& input) {
    return activation_with("fuseops::silu", input, Activation::Silu, Kernels::forward());
  }
  static void silu_out(const at::Tensor& input, at::Tensor& out) {
    activation_out_with("fuseops::silu.out", input, Activation::Silu, out,
                        Kernels::forward());
  }
  static at::Tensor silu_backward(const at::Tensor& grad_output, const at::Tensor& input) {
    return activation_backward_with("fuseops::silu_backward", grad_output, input,
                                    Activation::Silu, Kernels::backward());
  }
  static at::Tensor bias_gelu(const at::Tensor& input, const at::Tensor& bias,
                              c10::string_view approximate) {
    return bias_gelu_with(input, bias, approximate, Kernels::bias_gelu());
  }
  static void bias_gelu_out(const at::Tensor& input, const at::Tensor& bias,
                            c10::string_view approximate, at::Tensor& out) {
    bias_gelu_out_with(input, bias, approximate, out, Kernels::bias_gelu());
  }
  static std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& grad_output,
                                                               const at::Tensor& input,
                                                               const at::Tensor& bias,
                                                               c10::string_view approximate) {
    return bias_gelu_backward_with(grad_output, input, bias, approximate,
                                   Kernels::bias_gelu_backward());
  }

  static void register_all(torch::Library& m) {
    m.impl("gelu", TORCH_FN(gelu));
    m.impl("gelu.out", TORCH_FN(gelu_out));
    m.impl("gelu_backward", TORCH_FN(gelu_backward));
    m.impl("silu", TORCH_FN(silu));
    m.impl("silu.out", TORCH_FN(silu_out));
    m.impl("silu_backward", TORCH_FN(silu_backward));
    m.impl("bias_gelu", TORCH_FN(bias_gelu));
    m.impl("bias_gelu.out", TORCH_FN(bias_gelu_out));
    m.impl("bias_gelu_backward", TORCH_FN(bias_gelu_backward));
  }
};

}  // namespace fuseops::detail
