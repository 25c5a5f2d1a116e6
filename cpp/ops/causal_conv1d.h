#pragma once
// causal_conv1d's contract between its shared entry points and its kernels
// (see ops/relu.h).

#include <optional>
#include <string_view>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "ops_generated/causal_conv1d.h"

namespace fuseops::detail {

// The two layouts kernels read in place. kRows: x.stride(2) == 1, every
// (batch, channel) row contiguous in time. kChannelLast: x.stride(1) == 1,
// every (batch, time) row contiguous in channels (a transposed (batch,
// seqlen, dim) tensor). Other strides of x are free in both; every other
// (batch, dim, k) tensor a kernel takes or writes (out, grad_output,
// grad_x, initial_states, grad_final_states, grad_initial_states) is dense
// in the same layout: contiguous for kRows, strides (k*dim, 1, dim) for
// kChannelLast.
enum class ConvLayout { kRows, kChannelLast };

// Kernels get weight (dim, width) and bias (dim) contiguous in the
// accumulation type (float32, float64 for float64 x) -- bias undefined when
// absent -- and initial_states undefined when absent (zeros). Called with
// batch, dim and seqlen all > 0.
using CausalConv1dKernel = void (*)(const at::Tensor& out, const at::Tensor& x,
                                    const at::Tensor& weight, const at::Tensor& bias,
                                    const at::Tensor& initial_states, bool silu, ConvLayout layout);
// grad_weight (dim, width) and grad_bias (dim) are in the accumulation
// type, reduced in an order that depends only on the shapes.
// grad_final_states may be undefined (zero).
using CausalConv1dBackwardKernel = void (*)(
    const at::Tensor& grad_x, const at::Tensor& grad_weight, const at::Tensor& grad_bias,
    const at::Tensor& grad_initial_states, const at::Tensor& grad_output, const at::Tensor& x,
    const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& initial_states,
    const at::Tensor& grad_final_states, bool silu, ConvLayout layout);
// out (batch, dim, seqlen) contiguous; x (batch, dim, seqlen) and conv_state
// (batch, dim, state_len) with any strides, not sharing memory; weight and
// bias as above. Reads conv_state ++ x, writes out, then shifts conv_state.
using CausalConv1dUpdateKernel = void (*)(const at::Tensor& out, const at::Tensor& x,
                                          const at::Tensor& conv_state, const at::Tensor& weight,
                                          const at::Tensor& bias, bool silu);

using OptionalTensor = std::optional<at::Tensor>;
using ActivationName = std::optional<std::string_view>;

// Checks, layout and allocation common to every backend; `kernel` fills the
// outputs (nullptr for the Meta backend, which only needs shapes).
at::Tensor causal_conv1d_with(const at::Tensor& x, const at::Tensor& weight,
                              const OptionalTensor& bias, const OptionalTensor& initial_states,
                              ActivationName activation, CausalConv1dKernel kernel);
at::Tensor& causal_conv1d_out_with(const at::Tensor& x, const at::Tensor& weight,
                                   const OptionalTensor& bias, const OptionalTensor& initial_states,
                                   ActivationName activation, at::Tensor& out,
                                   CausalConv1dKernel kernel);
std::tuple<at::Tensor, at::Tensor> causal_conv1d_forward_with(
    const at::Tensor& x, const at::Tensor& weight, const OptionalTensor& bias,
    const OptionalTensor& initial_states, ActivationName activation, CausalConv1dKernel kernel);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> causal_conv1d_backward_with(
    const at::Tensor& grad_output, const at::Tensor& x, const at::Tensor& weight,
    const OptionalTensor& bias, const OptionalTensor& initial_states,
    const OptionalTensor& grad_final_states, ActivationName activation,
    CausalConv1dBackwardKernel kernel);
at::Tensor causal_conv1d_update_with(const at::Tensor& x, const at::Tensor& conv_state,
                                     const at::Tensor& weight, const OptionalTensor& bias,
                                     ActivationName activation, CausalConv1dUpdateKernel kernel);

// The dispatcher entry points of one backend, whose `Kernels::forward()`,
// `Kernels::backward()` and `Kernels::update()` return its kernels.
template <typename Kernels>
struct CausalConv1dRegistrations {
  using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

  static at::Tensor causal_conv1d(const at::Tensor& x, const at::Tensor& weight,
                                  const OptionalTensor& bias, const OptionalTensor& initial_states,
                                  ActivationName activation) {
    return causal_conv1d_with(x, weight, bias, initial_states, activation, Kernels::forward());
  }
  static void causal_conv1d_out(const at::Tensor& x, const at::Tensor& weight,
                                const OptionalTensor& bias, const OptionalTensor& initial_states,
                                ActivationName activation, at::Tensor& out) {
    causal_conv1d_out_with(x, weight, bias, initial_states, activation, out, Kernels::forward());
  }
  static std::tuple<at::Tensor, at::Tensor> causal_conv1d_forward(
      const at::Tensor& x, const at::Tensor& weight, const OptionalTensor& bias,
      const OptionalTensor& initial_states, ActivationName activation) {
    return causal_conv1d_forward_with(x, weight, bias, initial_states, activation,
                                      Kernels::forward());
  }
  static Grads causal_conv1d_backward(const at::Tensor& grad_output, const at::Tensor& x,
                                      const at::Tensor& weight, const OptionalTensor& bias,
                                      const OptionalTensor& initial_states,
                                      const OptionalTensor& grad_final_states,
                                      ActivationName activation) {
    return causal_conv1d_backward_with(grad_output, x, weight, bias, initial_states,
                                       grad_final_states, activation, Kernels::backward());
  }
  static at::Tensor causal_conv1d_update(const at::Tensor& x, at::Tensor& conv_state,
                                         const at::Tensor& weight, const OptionalTensor& bias,
                                         ActivationName activation) {
    return causal_conv1d_update_with(x, conv_state, weight, bias, activation, Kernels::update());
  }

  // The operators of cpp/ops/causal_conv1d.yaml's `ops:`, each with the function of
  // the same name.
  template <typename Library>
  static void register_all(Library& m) {
    register_causal_conv1d_kernels<CausalConv1dRegistrations>(m);
  }
};

}  // namespace fuseops::detail
