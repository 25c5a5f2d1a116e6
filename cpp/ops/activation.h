#pragma once
// The contract of the activation ops (gelu, silu, bias_gelu) between their
// shared entry points and their kernels (see ops/relu.h), and the activation
// choice the gated ops reuse.

#include <cmath>
#include <string_view>
#include <tuple>
#include <type_traits>

#include <ATen/core/Tensor.h>

#include "ops_generated/activation.h"

namespace fuseops::detail {

enum class Activation { Silu, GeluErf, GeluTanh };

// The GELU constants of every backend: host code, the CPU kernels and (as
// compile-time constants) the CUDA kernels.
template <typename T>
struct GeluConstants {
  static constexpr T kAlpha = T(M_SQRT1_2);                      // 1/sqrt(2)
  static constexpr T kBeta = T(M_2_SQRTPI * M_SQRT1_2 * 0.5);    // 1/sqrt(2*pi)
  static constexpr T kTanhBeta = T(M_SQRT2 * M_2_SQRTPI * 0.5);  // sqrt(2/pi)
  static constexpr T kKappa = T(0.044715);
};

// Runs fn(std::integral_constant<Activation, A>{}) for the runtime `activation`.
template <typename Fn>
inline void dispatch_activation(Activation activation, const Fn& fn) {
  switch (activation) {
    case Activation::Silu:
      fn(std::integral_constant<Activation, Activation::Silu>{});
      break;
    case Activation::GeluErf:
      fn(std::integral_constant<Activation, Activation::GeluErf>{});
      break;
    case Activation::GeluTanh:
      fn(std::integral_constant<Activation, Activation::GeluTanh>{});
      break;
  }
}

// The GELU form named by an `approximate` argument ("none" or "tanh"); any
// other string is an error naming `op`.
Activation parse_gelu_approximate(const char* op, std::string_view approximate);

// Elementwise kernels: contiguous tensors of one shape and dtype, outputs
// already allocated.
using ActivationKernel = void (*)(const at::Tensor& out, const at::Tensor& input,
                                  Activation activation);
using ActivationBackwardKernel = void (*)(const at::Tensor& grad_input,
                                          const at::Tensor& grad_output, const at::Tensor& input,
                                          Activation activation);

// bias_gelu kernels: contiguous `input`/`out`/`grad_*` viewed as rows of
// bias.numel() elements, contiguous 1-D `bias`.
using BiasGeluKernel = void (*)(const at::Tensor& out, const at::Tensor& input,
                                const at::Tensor& bias, Activation activation);
using BiasGeluBackwardKernel = void (*)(const at::Tensor& grad_input, const at::Tensor& grad_bias,
                                        const at::Tensor& grad_output, const at::Tensor& input,
                                        const at::Tensor& bias, Activation activation);

// Checks, layout and allocation common to every backend; `kernel` fills the
// outputs (nullptr for the Meta backend, which only needs shapes). `op` names
// the op in error messages.
at::Tensor activation_with(const char* op, const at::Tensor& input, Activation activation,
                           ActivationKernel kernel);
at::Tensor& activation_out_with(const char* op, const at::Tensor& input, Activation activation,
                                at::Tensor& out, ActivationKernel kernel);
at::Tensor activation_backward_with(const char* op, const at::Tensor& grad_output,
                                    const at::Tensor& input, Activation activation,
                                    ActivationBackwardKernel kernel);

at::Tensor& activation_backward_out_with(const char* op, const at::Tensor& grad_output,
                                         const at::Tensor& input, Activation activation,
                                         at::Tensor& grad_input, ActivationBackwardKernel kernel);
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
void bias_gelu_backward_out_with(const at::Tensor& grad_output, const at::Tensor& input,
                                 const at::Tensor& bias, std::string_view approximate,
                                 at::Tensor& grad_input, at::Tensor& grad_bias,
                                 BiasGeluBackwardKernel kernel);

// The dispatcher entry points of one backend, whose `Kernels::forward()`,
// `backward()`, `bias_gelu()` and `bias_gelu_backward()` return its kernels.
template <typename Kernels>
struct ActivationRegistrations {
  static at::Tensor gelu(const at::Tensor& input, std::string_view approximate) {
    constexpr const char* op = "fuseops::gelu";
    return activation_with(op, input, parse_gelu_approximate(op, approximate), Kernels::forward());
  }
  static void gelu_out(const at::Tensor& input, std::string_view approximate, at::Tensor& out) {
    constexpr const char* op = "fuseops::gelu.out";
    activation_out_with(op, input, parse_gelu_approximate(op, approximate), out,
                        Kernels::forward());
  }
  static at::Tensor gelu_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                  std::string_view approximate) {
    constexpr const char* op = "fuseops::gelu_backward";
    return activation_backward_with(op, grad_output, input, parse_gelu_approximate(op, approximate),
                                    Kernels::backward());
  }
  static void gelu_backward_out(const at::Tensor& grad_output, const at::Tensor& input,
                                std::string_view approximate, at::Tensor& out) {
    constexpr const char* op = "fuseops::gelu_backward.out";
    activation_backward_out_with(op, grad_output, input, parse_gelu_approximate(op, approximate),
                                 out, Kernels::backward());
  }
  static at::Tensor silu(const at::Tensor& input) {
    return activation_with("fuseops::silu", input, Activation::Silu, Kernels::forward());
  }
  static void silu_out(const at::Tensor& input, at::Tensor& out) {
    activation_out_with("fuseops::silu.out", input, Activation::Silu, out, Kernels::forward());
  }
  static at::Tensor silu_backward(const at::Tensor& grad_output, const at::Tensor& input) {
    return activation_backward_with("fuseops::silu_backward", grad_output, input, Activation::Silu,
                                    Kernels::backward());
  }
  static void silu_backward_out(const at::Tensor& grad_output, const at::Tensor& input,
                                at::Tensor& out) {
    activation_backward_out_with("fuseops::silu_backward.out", grad_output, input, Activation::Silu,
                                 out, Kernels::backward());
  }
  static at::Tensor bias_gelu(const at::Tensor& input, const at::Tensor& bias,
                              std::string_view approximate) {
    return bias_gelu_with(input, bias, approximate, Kernels::bias_gelu());
  }
  static void bias_gelu_out(const at::Tensor& input, const at::Tensor& bias,
                            std::string_view approximate, at::Tensor& out) {
    bias_gelu_out_with(input, bias, approximate, out, Kernels::bias_gelu());
  }
  static std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& grad_output,
                                                               const at::Tensor& input,
                                                               const at::Tensor& bias,
                                                               std::string_view approximate) {
    return bias_gelu_backward_with(grad_output, input, bias, approximate,
                                   Kernels::bias_gelu_backward());
  }
  static void bias_gelu_backward_out(const at::Tensor& grad_output, const at::Tensor& input,
                                     const at::Tensor& bias, std::string_view approximate,
                                     at::Tensor& grad_input, at::Tensor& grad_bias) {
    bias_gelu_backward_out_with(grad_output, input, bias, approximate, grad_input, grad_bias,
                                Kernels::bias_gelu_backward());
  }

  // The operators of cpp/ops/activation.yaml's `ops:`, each with the function of
  // the same name.
  template <typename Library>
  static void register_all(Library& m) {
    register_activation_kernels<ActivationRegistrations>(m);
  }
};

}  // namespace fuseops::detail
