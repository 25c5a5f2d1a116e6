// Autograd for fuseops::moe_experts, registered in C++ so LibTorch programs
// get gradients without Python. The forward keeps every pair's first product
// ([T * K, 2I] in the compute dtype: moe_experts_forward) besides its inputs,
// so that the backward runs five products per expert, not six.
// moe_experts_forward and moe_experts_backward are not differentiable (see
// autograd/no_derivative.h).

#include <string>
#include <tuple>

#include <torch/library.h>

#include <fuseops/moe_experts.h>

#include "ops/autograd/function.h"
#include "ops/autograd/no_derivative.h"
#include "ops/common/checks.h"
#include "ops_generated/autograd/moe_experts.h"

namespace fuseops {
namespace {

class MoeExpertsFunction : public torch::autograd::Function<MoeExpertsFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& top_k_index, const at::Tensor& top_k_weights,
                            const at::Tensor& gate_up_proj, const at::Tensor& down_proj,
                            const std::string& activation) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, gate_up_out] = fuseops::moe_experts_forward(hidden, top_k_index, top_k_weights,
                                                           gate_up_proj, down_proj, activation);
    ctx->save_for_backward(
        {hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, gate_up_out});
    ctx->saved_data["activation"] = activation;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    // Frozen experts (adapters trained around them) skip the two weight
    // gradients, a quarter of the backward's products.
    const bool expert_grads = ctx->needs_input_grad(3) || ctx->needs_input_grad(4);
    auto [grad_hidden, grad_weights, grad_gate_up, grad_down] = fuseops::moe_experts_backward(
        grads[0].contiguous(), saved[0], saved[1], saved[2], saved[3], saved[4],
        ctx->saved_data["activation"].toStringRef(), expert_grads, saved[5]);
    return {ctx->needs_input_grad(0) ? grad_hidden : at::Tensor(),
            at::Tensor(),
            ctx->needs_input_grad(2) ? grad_weights : at::Tensor(),
            ctx->needs_input_grad(3) ? grad_gate_up : at::Tensor(),
            ctx->needs_input_grad(4) ? grad_down : at::Tensor(),
            at::Tensor()};
  }
};

// The Autograd kernels cpp/ops/moe_experts.yaml declares as functions.
struct MoeExpertsAutograd {
  static at::Tensor moe_experts(const at::Tensor& hidden, const at::Tensor& top_k_index,
                                const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj,
                                const at::Tensor& down_proj, c10::string_view activation) {
    constexpr const char* op = "fuseops::moe_experts";
    if (!autograd_detail::records_grad(
            {hidden, top_k_index, top_k_weights, gate_up_proj, down_proj})) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      return fuseops::moe_experts(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                                  activation);
    }
    check_floating_input(op, "hidden", hidden);
    TORCH_CHECK(top_k_index.defined(), op, ": argument 'top_k_index' must be a tensor, got None");
    check_floating_input(op, "top_k_weights", top_k_weights);
    check_floating_input(op, "gate_up_proj", gate_up_proj);
    check_floating_input(op, "down_proj", down_proj);
    return MoeExpertsFunction::apply(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                                     std::string(activation));
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  detail::register_moe_experts_autograd<MoeExpertsAutograd>(m);
}

}  // namespace fuseops
