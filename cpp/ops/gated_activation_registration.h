#pragma once
// Dispatcher registration of swiglu/geglu for one backend. A backend supplies
// its kernels as a struct with static functions forward() and backward();
// checks, layout and allocation are the shared *_with functions.

#include <torch/library.h>

#include "ops/gated_activation.h"

namespace fuseops::detail {

struct MetaGatedKernels {
  static GatedKernel forward() { return nullptr; }
  static GatedBackwardKernel backward() { return nullptr; }
};

template <typename Kernels>
struct GatedRegistrations {
  using TensorPair = std::tuple<at::Tensor, at::Tensor>;

  static at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
    return gated_with("fuseops::swiglu", gate, up, Activation::Silu, Kernels::forward());
  }
  static void swiglu_out(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out) {
    gated_out_with("fuseops::swiglu.out", gate, up, Activation::Silu, out, Kernels::forward());
  }
  static at::Tensor swiglu_packed(const at::Tensor& input) {
    return gated_packed_with("fuseops::swiglu.packed", input, Activation::Silu,
                             Kernels::forward());
  }
  static void swiglu_packed_out(const at::Tensor& input, at::Tensor& out) {
    gated_packed_out_with("fuseops::swiglu.packed_out", input, Activation::Silu, out,
                          Kernels::forward());
  }
  static TensorPair swiglu_backward(const at::Tensor& grad_output, const at::Tensor& gate,
                                    const at::Tensor& up) {
    return gated_backward_with("fuseops::swiglu_backward", grad_output, gate, up,
                               Activation::Silu, Kernels::backward());
  }
  static at::Tensor swiglu_packed_backward(const at::Tensor& grad_output,
                                           const at::Tensor& input) {
    return gated_packed_backward_with("fuseops::swiglu_backward.packed", grad_output, input,
                                      Activation::Silu, Kernels::backward());
  }

  static at::Tensor geglu(const at::Tensor& gate, const at::Tensor& up,
                          c10::string_view approximate) {
    constexpr const char* op = "fuseops::geglu";
    return gated_with(op, gate, up, parse_gelu_approximate(op, approximate),
                      Kernels::forward());
  }
  static void geglu_out(const at::Tensor& gate, const at::Tensor& up,
                        c10::string_view approximate, at::Tensor& out) {
    constexpr const char* op = "fuseops::geglu.out";
    gated_out_with(op, gate, up, parse_gelu_approximate(op, approximate), out,
                   Kernels::forward());
  }
  static at::Tensor geglu_packed(const at::Tensor& input, c10::string_view approximate) {
    constexpr const char* op = "fuseops::geglu.packed";
    return gated_packed_with(op, input, parse_gelu_approximate(op, approximate),
                             Kernels::forward());
  }
  static void geglu_packed_out(const at::Tensor& input, c10::string_view approximate,
                               at::Tensor& out) {
    constexpr const char* op = "fuseops::geglu.packed_out";
    gated_packed_out_with(op, input, parse_gelu_approximate(op, approximate), out,
                          Kernels::forward());
  }
  static TensorPair geglu_backward(const at::Tensor& grad_output, const at::Tensor& gate,
                                   const at::Tensor& up, c10::string_view approximate) {
    constexpr const char* op = "fuseops::geglu_backward";
    return gated_backward_with(op, grad_output, gate, up,
                               parse_gelu_approximate(op, approximate), Kernels::backward());
  }
  static at::Tensor geglu_packed_backward(const at::Tensor& grad_output,
                                          const at::Tensor& input,
                                          c10::string_view approximate) {
    constexpr const char* op = "fuseops::geglu_backward.packed";
    return gated_packed_backward_with(op, grad_output, input,
                                      parse_gelu_approximate(op, approximate),
                                      Kernels::backward());
  }

  static void register_all(torch::Library& m) {
    m.impl("swiglu", TORCH_FN(swiglu));
    m.impl("swiglu.out", TORCH_FN(swiglu_out));
    m.impl("swiglu.packed", TORCH_FN(swiglu_packed));
    m.impl("swiglu.packed_out", TORCH_FN(swiglu_packed_out));
    m.impl("swiglu_backward", TORCH_FN(swiglu_backward));
    m.impl("swiglu_backward.packed", TORCH_FN(swiglu_packed_backward));
    m.impl("geglu", TORCH_FN(geglu));
    m.impl("geglu.out", TORCH_FN(geglu_out));
    m.impl("geglu.packed", TORCH_FN(geglu_packed));
    m.impl("geglu.packed_out", TORCH_FN(geglu_packed_out));
    m.impl("geglu_backward", TORCH_FN(geglu_backward));
    m.impl("geglu_backward.packed", TORCH_FN(geglu_packed_backward));
  }
};

}  // namespace fuseops::detail
