#pragma once
// The contract of moe_experts between its shared entry points and its
// kernels (see ops/relu.h).

#include <optional>
#include <string_view>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "ops/activation.h"
#include "ops_generated/moe_experts.h"

namespace fuseops::detail {

// What the kernels get: hidden [T, H] and grad_output [T, H] contiguous;
// top_k_index [T, K] int64 contiguous (values not yet checked: the kernel
// checks them and names `op` in the error); top_k_weights [T, K]
// contiguous, any floating dtype; gate_up_proj [E, 2I, H] and down_proj
// [E, H, I] of hidden's dtype in any strides. Outputs are allocated and
// contiguous; in the backward, grad_gate_up_proj and grad_down_proj are
// undefined when the experts' gradients are not wanted. gate_up_out [T * K,
// 2I] in the compute dtype (float32 for bfloat16/float16) holds every
// pair's first product, its rows in the kernels' order (the pairs sorted by
// expert, stably): the forward writes it when it is defined, the backward
// reads it when it is defined and recomputes it otherwise.
using MoeExpertsKernel = void (*)(const at::Tensor& out, const at::Tensor& gate_up_out,
                                  const at::Tensor& hidden, const at::Tensor& top_k_index,
                                  const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj,
                                  const at::Tensor& down_proj, Activation activation,
                                  const char* op);
using MoeExpertsBackwardKernel = void (*)(
    const at::Tensor& grad_hidden, const at::Tensor& grad_top_k_weights,
    const at::Tensor& grad_gate_up_proj, const at::Tensor& grad_down_proj,
    const at::Tensor& grad_output, const at::Tensor& hidden, const at::Tensor& top_k_index,
    const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj, const at::Tensor& down_proj,
    const at::Tensor& gate_up_out, Activation activation, const char* op);

// The activation named by moe_experts' `activation` argument ("silu",
// "gelu", "gelu_tanh"); any other string is an error naming `op`.
Activation parse_moe_activation(const char* op, std::string_view activation);

// Checks, layout and allocation common to every backend (kernel nullptr for
// Meta). `op` names the op in error messages. The _forward form also
// returns gate_up_out, for the backward.
at::Tensor moe_experts_with(const char* op, const at::Tensor& hidden, const at::Tensor& top_k_index,
                            const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj,
                            const at::Tensor& down_proj, std::string_view activation,
                            MoeExpertsKernel kernel);
std::tuple<at::Tensor, at::Tensor> moe_experts_forward_with(
    const char* op, const at::Tensor& hidden, const at::Tensor& top_k_index,
    const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj, const at::Tensor& down_proj,
    std::string_view activation, MoeExpertsKernel kernel);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_experts_backward_with(
    const char* op, const at::Tensor& grad_output, const at::Tensor& hidden,
    const at::Tensor& top_k_index, const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj,
    const at::Tensor& down_proj, std::string_view activation, bool expert_grads,
    const std::optional<at::Tensor>& gate_up_out, MoeExpertsBackwardKernel kernel);

// The dispatcher entry points of one backend, whose `Kernels::forward()` and
// `Kernels::backward()` return its kernels.
template <typename Kernels>
struct MoeExpertsRegistrations {
  static at::Tensor moe_experts(const at::Tensor& hidden, const at::Tensor& top_k_index,
                                const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj,
                                const at::Tensor& down_proj, std::string_view activation) {
    return moe_experts_with("fuseops::moe_experts", hidden, top_k_index, top_k_weights,
                            gate_up_proj, down_proj, activation, Kernels::forward());
  }
  static std::tuple<at::Tensor, at::Tensor> moe_experts_forward(
      const at::Tensor& hidden, const at::Tensor& top_k_index, const at::Tensor& top_k_weights,
      const at::Tensor& gate_up_proj, const at::Tensor& down_proj, std::string_view activation) {
    return moe_experts_forward_with("fuseops::moe_experts_forward", hidden, top_k_index,
                                    top_k_weights, gate_up_proj, down_proj, activation,
                                    Kernels::forward());
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_experts_backward(
      const at::Tensor& grad_output, const at::Tensor& hidden, const at::Tensor& top_k_index,
      const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj, const at::Tensor& down_proj,
      std::string_view activation, bool expert_grads,
      const std::optional<at::Tensor>& gate_up_out) {
    return moe_experts_backward_with("fuseops::moe_experts_backward", grad_output, hidden,
                                     top_k_index, top_k_weights, gate_up_proj, down_proj,
                                     activation, expert_grads, gate_up_out, Kernels::backward());
  }

  // The operators of cpp/ops/moe_experts.yaml's `ops:`, each with the function of
  // the same name.
  template <typename Library>
  static void register_all(Library& m) {
    register_moe_experts_kernels<MoeExpertsRegistrations>(m);
  }
};

}  // namespace fuseops::detail
