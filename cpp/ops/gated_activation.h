#pragma once
// The contract of the gated activations (swiglu, geglu) between their shared
// entry points and their kernels (see ops/relu.h).

#include <string_view>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "ops/activation.h"
#include "ops_generated/gated_activation.h"

namespace fuseops::detail {

// Kernels see every tensor as a 2-D [rows, H] view whose rows are
// contiguous (stride(1) == 1) but may be any distance apart (stride(0)): the
// two halves of a packed [..., 2*H] tensor are such views, so packed inputs
// and gradients are read and written in place. All views share shape and
// dtype; outputs are allocated.
using GatedKernel = void (*)(const at::Tensor& out, const at::Tensor& gate, const at::Tensor& up,
                             Activation activation);
using GatedBackwardKernel = void (*)(const at::Tensor& grad_gate, const at::Tensor& grad_up,
                                     const at::Tensor& grad_output, const at::Tensor& gate,
                                     const at::Tensor& up, Activation activation);

// Checks, layout and allocation common to every backend (kernel nullptr for
// Meta). `op` names the op in error messages.
at::Tensor gated_with(const char* op, const at::Tensor& gate, const at::Tensor& up,
                      Activation activation, GatedKernel kernel);
at::Tensor& gated_out_with(const char* op, const at::Tensor& gate, const at::Tensor& up,
                           Activation activation, at::Tensor& out, GatedKernel kernel);
std::tuple<at::Tensor, at::Tensor> gated_backward_with(const char* op,
                                                       const at::Tensor& grad_output,
                                                       const at::Tensor& gate, const at::Tensor& up,
                                                       Activation activation,
                                                       GatedBackwardKernel kernel);

void gated_backward_out_with(const char* op, const at::Tensor& grad_output, const at::Tensor& gate,
                             const at::Tensor& up, Activation activation, at::Tensor& grad_gate,
                             at::Tensor& grad_up, GatedBackwardKernel kernel);

at::Tensor gated_packed_with(const char* op, const at::Tensor& input, Activation activation,
                             GatedKernel kernel);
at::Tensor& gated_packed_out_with(const char* op, const at::Tensor& input, Activation activation,
                                  at::Tensor& out, GatedKernel kernel);
at::Tensor gated_packed_backward_with(const char* op, const at::Tensor& grad_output,
                                      const at::Tensor& input, Activation activation,
                                      GatedBackwardKernel kernel);

// The dispatcher entry points of one backend, whose `Kernels::forward()` and
// `Kernels::backward()` return its kernels.
template <typename Kernels>
struct GatedActivationRegistrations {
  using TensorPair = std::tuple<at::Tensor, at::Tensor>;

  static at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
    return gated_with("fuseops::swiglu", gate, up, Activation::Silu, Kernels::forward());
  }
  static void swiglu_out(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out) {
    gated_out_with("fuseops::swiglu.out", gate, up, Activation::Silu, out, Kernels::forward());
  }
  static at::Tensor swiglu_packed(const at::Tensor& input) {
    return gated_packed_with("fuseops::swiglu.packed", input, Activation::Silu, Kernels::forward());
  }
  static void swiglu_packed_out(const at::Tensor& input, at::Tensor& out) {
    gated_packed_out_with("fuseops::swiglu.packed_out", input, Activation::Silu, out,
                          Kernels::forward());
  }
  static TensorPair swiglu_backward(const at::Tensor& grad_output, const at::Tensor& gate,
                                    const at::Tensor& up) {
    return gated_backward_with("fuseops::swiglu_backward", grad_output, gate, up, Activation::Silu,
                               Kernels::backward());
  }
  static void swiglu_backward_out(const at::Tensor& grad_output, const at::Tensor& gate,
                                  const at::Tensor& up, at::Tensor& grad_gate,
                                  at::Tensor& grad_up) {
    gated_backward_out_with("fuseops::swiglu_backward.out", grad_output, gate, up, Activation::Silu,
                            grad_gate, grad_up, Kernels::backward());
  }
  static at::Tensor swiglu_backward_packed(const at::Tensor& grad_output, const at::Tensor& input) {
    return gated_packed_backward_with("fuseops::swiglu_backward.packed", grad_output, input,
                                      Activation::Silu, Kernels::backward());
  }

  static at::Tensor geglu(const at::Tensor& gate, const at::Tensor& up,
                          std::string_view approximate) {
    constexpr const char* op = "fuseops::geglu";
    return gated_with(op, gate, up, parse_gelu_approximate(op, approximate), Kernels::forward());
  }
  static void geglu_out(const at::Tensor& gate, const at::Tensor& up, std::string_view approximate,
                        at::Tensor& out) {
    constexpr const char* op = "fuseops::geglu.out";
    gated_out_with(op, gate, up, parse_gelu_approximate(op, approximate), out, Kernels::forward());
  }
  static at::Tensor geglu_packed(const at::Tensor& input, std::string_view approximate) {
    constexpr const char* op = "fuseops::geglu.packed";
    return gated_packed_with(op, input, parse_gelu_approximate(op, approximate),
                             Kernels::forward());
  }
  static void geglu_packed_out(const at::Tensor& input, std::string_view approximate,
                               at::Tensor& out) {
    constexpr const char* op = "fuseops::geglu.packed_out";
    gated_packed_out_with(op, input, parse_gelu_approximate(op, approximate), out,
                          Kernels::forward());
  }
  static TensorPair geglu_backward(const at::Tensor& grad_output, const at::Tensor& gate,
                                   const at::Tensor& up, std::string_view approximate) {
    constexpr const char* op = "fuseops::geglu_backward";
    return gated_backward_with(op, grad_output, gate, up, parse_gelu_approximate(op, approximate),
                               Kernels::backward());
  }
  static void geglu_backward_out(const at::Tensor& grad_output, const at::Tensor& gate,
                                 const at::Tensor& up, std::string_view approximate,
                                 at::Tensor& grad_gate, at::Tensor& grad_up) {
    constexpr const char* op = "fuseops::geglu_backward.out";
    gated_backward_out_with(op, grad_output, gate, up, parse_gelu_approximate(op, approximate),
                            grad_gate, grad_up, Kernels::backward());
  }
  static at::Tensor geglu_backward_packed(const at::Tensor& grad_output, const at::Tensor& input,
                                          std::string_view approximate) {
    constexpr const char* op = "fuseops::geglu_backward.packed";
    return gated_packed_backward_with(op, grad_output, input,
                                      parse_gelu_approximate(op, approximate), Kernels::backward());
  }

  // The operators of cpp/ops/gated_activation.yaml's `ops:`, each with the function of
  // the same name.
  template <typename Library>
  static void register_all(Library& m) {
    register_gated_activation_kernels<GatedActivationRegistrations>(m);
  }
};

}  // namespace fuseops::detail
