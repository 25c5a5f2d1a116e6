// fuseops::moe_experts and its backward: the C++ API, the shared checks and the
// `*_with` entry points that every backend's kernels go through. The schemas
// and the Meta, CPU and CUDA registrations are generated from
// cpp/ops/moe_experts.yaml. CPU kernels: cpp/ops/cpu/moe_experts_kernel.cpp;
// CUDA: cuda/moe_experts_kernel.cu; autograd: cpp/ops/autograd/moe_experts.cpp.

#include "ops/moe_experts.h"

#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <fuseops/moe_experts.h>

#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/output_memory.h"
#include "ops/common/tensors.h"

namespace fuseops {
namespace detail {
namespace {

// The sizes every check and output derives from.
struct MoeShape {
  int64_t tokens, hidden, top_k, experts, intermediate;
};

MoeShape check_moe_inputs(const char* op, const at::Tensor& hidden, const at::Tensor& top_k_index,
                          const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj,
                          const at::Tensor& down_proj) {
  check_floating_input(op, "hidden", hidden);
  TORCH_CHECK(hidden.dim() == 2, op, ": argument 'hidden' must be 2-D [tokens, hidden], got shape ",
              hidden.sizes());
  TORCH_CHECK(top_k_index.defined(), op, ": argument 'top_k_index' must be a tensor, got None");
  TORCH_CHECK(top_k_index.scalar_type() == at::kLong || top_k_index.scalar_type() == at::kInt, op,
              ": argument 'top_k_index' must be int64 or int32, got ", top_k_index.scalar_type());
  check_same_device(op, "top_k_index", top_k_index, "hidden", hidden);
  TORCH_CHECK(top_k_index.dim() == 2 && top_k_index.size(0) == hidden.size(0), op,
              ": argument 'top_k_index' must be [tokens, top_k] with the tokens of 'hidden' (",
              hidden.size(0), "), got shape ", top_k_index.sizes());
  check_floating_input(op, "top_k_weights", top_k_weights);
  check_same_device(op, "top_k_weights", top_k_weights, "hidden", hidden);
  check_same_shape(op, "top_k_weights", top_k_weights, "top_k_index", top_k_index);
  check_floating_input(op, "gate_up_proj", gate_up_proj);
  check_same_dtype(op, "gate_up_proj", gate_up_proj, "hidden", hidden);
  check_same_device(op, "gate_up_proj", gate_up_proj, "hidden", hidden);
  TORCH_CHECK(gate_up_proj.dim() == 3 && gate_up_proj.size(1) % 2 == 0 &&
                  gate_up_proj.size(2) == hidden.size(1),
              op,
              ": argument 'gate_up_proj' must be [experts, 2 * intermediate, hidden] with the "
              "hidden size of 'hidden' (",
              hidden.size(1), "), got shape ", gate_up_proj.sizes());
  check_floating_input(op, "down_proj", down_proj);
  check_same_dtype(op, "down_proj", down_proj, "hidden", hidden);
  check_same_device(op, "down_proj", down_proj, "hidden", hidden);
  const int64_t experts = gate_up_proj.size(0);
  const int64_t intermediate = gate_up_proj.size(1) / 2;
  TORCH_CHECK(down_proj.dim() == 3 && down_proj.size(0) == experts &&
                  down_proj.size(1) == hidden.size(1) && down_proj.size(2) == intermediate,
              op, ": argument 'down_proj' must be [experts, hidden, intermediate] = [", experts,
              ", ", hidden.size(1), ", ", intermediate, "] (from 'gate_up_proj' ",
              gate_up_proj.sizes(), "), got shape ", down_proj.sizes());
  return {hidden.size(0), hidden.size(1), top_k_index.size(1), experts, intermediate};
}

}  // namespace

Activation parse_moe_activation(const char* op, std::string_view activation) {
  if (activation == "silu") {
    return Activation::Silu;
  }
  if (activation == "gelu") {
    return Activation::GeluErf;
  }
  if (activation == "gelu_tanh") {
    return Activation::GeluTanh;
  }
  TORCH_CHECK(false, op, ": argument 'activation' must be 'silu', 'gelu' or 'gelu_tanh', got '",
              activation, "'");
}

namespace {

// The forward of both overloads; gate_up_out is allocated and filled when
// `keep_gate_up` is set.
std::tuple<at::Tensor, at::Tensor> moe_forward(
    const char* op, const at::Tensor& hidden, const at::Tensor& top_k_index,
    const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj, const at::Tensor& down_proj,
    std::string_view activation, bool keep_gate_up, MoeExpertsKernel kernel) {
  const MoeShape s =
      check_moe_inputs(op, hidden, top_k_index, top_k_weights, gate_up_proj, down_proj);
  const Activation act = parse_moe_activation(op, activation);
  at::Tensor out = empty_output({s.tokens, s.hidden}, hidden.options());
  at::Tensor gate_up_out;
  if (keep_gate_up) {
    gate_up_out = empty_output({s.tokens * s.top_k, 2 * s.intermediate},
                               hidden.options().dtype(at::toOpMathType(hidden.scalar_type())));
  }
  if (kernel != nullptr && (out.numel() > 0 || (keep_gate_up && gate_up_out.numel() > 0))) {
    kernel(out, gate_up_out, hidden.contiguous(), top_k_index.to(at::kLong).contiguous(),
           top_k_weights.contiguous(), gate_up_proj, down_proj, act, op);
  }
  return {out, gate_up_out};
}

}  // namespace

at::Tensor moe_experts_with(const char* op, const at::Tensor& hidden, const at::Tensor& top_k_index,
                            const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj,
                            const at::Tensor& down_proj, std::string_view activation,
                            MoeExpertsKernel kernel) {
  return std::get<0>(moe_forward(op, hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                                 activation, false, kernel));
}

std::tuple<at::Tensor, at::Tensor> moe_experts_forward_with(
    const char* op, const at::Tensor& hidden, const at::Tensor& top_k_index,
    const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj, const at::Tensor& down_proj,
    std::string_view activation, MoeExpertsKernel kernel) {
  return moe_forward(op, hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, activation,
                     true, kernel);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_experts_backward_with(
    const char* op, const at::Tensor& grad_output, const at::Tensor& hidden,
    const at::Tensor& top_k_index, const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj,
    const at::Tensor& down_proj, std::string_view activation, bool expert_grads,
    const std::optional<at::Tensor>& gate_up_out, MoeExpertsBackwardKernel kernel) {
  const MoeShape s =
      check_moe_inputs(op, hidden, top_k_index, top_k_weights, gate_up_proj, down_proj);
  check_floating_input(op, "grad_output", grad_output);
  check_same_dtype(op, "grad_output", grad_output, "hidden", hidden);
  check_same_device(op, "grad_output", grad_output, "hidden", hidden);
  check_same_shape(op, "grad_output", grad_output, "hidden", hidden);
  const Activation act = parse_moe_activation(op, activation);
  const at::Tensor kept = undefined_if_none(gate_up_out);
  if (kept.defined()) {
    const at::ScalarType compute = at::toOpMathType(hidden.scalar_type());
    TORCH_CHECK(kept.scalar_type() == compute && kept.dim() == 2 &&
                    kept.size(0) == s.tokens * s.top_k && kept.size(1) == 2 * s.intermediate,
                op, ": argument 'gate_up_out' must be moe_experts_forward's second result, a ",
                compute, " tensor [tokens * top_k, 2 * intermediate] = [", s.tokens * s.top_k, ", ",
                2 * s.intermediate, "], got ", kept.scalar_type(), " ", kept.sizes());
    check_same_device(op, "gate_up_out", kept, "hidden", hidden);
  }
  at::Tensor grad_hidden = empty_output(hidden.sizes(), hidden.options());
  at::Tensor grad_weights = empty_output(top_k_weights.sizes(), top_k_weights.options());
  at::Tensor grad_gate_up = empty_output(expert_grads ? gate_up_proj.sizes() : at::IntArrayRef{0},
                                         gate_up_proj.options());
  at::Tensor grad_down =
      empty_output(expert_grads ? down_proj.sizes() : at::IntArrayRef{0}, down_proj.options());
  if (kernel != nullptr) {
    kernel(grad_hidden, grad_weights, expert_grads ? grad_gate_up : at::Tensor(),
           expert_grads ? grad_down : at::Tensor(), grad_output.contiguous(), hidden.contiguous(),
           top_k_index.to(at::kLong).contiguous(), top_k_weights.contiguous(), gate_up_proj,
           down_proj, kept.defined() ? kept.contiguous() : kept, act, op);
  }
  return {grad_hidden, grad_weights, grad_gate_up, grad_down};
}

}  // namespace detail

// C++ API: through the dispatcher, so autograd and the device kernels apply.
// Undefined tensors carry no dispatch key, so they are rejected here, before
// the dispatcher would fail with a message that names no argument.
namespace {

void check_defined(const char* op, const at::Tensor& hidden, const at::Tensor& top_k_index,
                   const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj,
                   const at::Tensor& down_proj) {
  check_floating_input(op, "hidden", hidden);
  TORCH_CHECK(top_k_index.defined(), op, ": argument 'top_k_index' must be a tensor, got None");
  check_floating_input(op, "top_k_weights", top_k_weights);
  check_floating_input(op, "gate_up_proj", gate_up_proj);
  check_floating_input(op, "down_proj", down_proj);
}

}  // namespace

at::Tensor moe_experts(const at::Tensor& hidden, const at::Tensor& top_k_index,
                       const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj,
                       const at::Tensor& down_proj, std::string_view activation) {
  check_defined("fuseops::moe_experts", hidden, top_k_index, top_k_weights, gate_up_proj,
                down_proj);
  static auto op = detail::find_op<decltype(moe_experts)>("fuseops::moe_experts");
  return op.call(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, activation);
}

std::tuple<at::Tensor, at::Tensor> moe_experts_forward(
    const at::Tensor& hidden, const at::Tensor& top_k_index, const at::Tensor& top_k_weights,
    const at::Tensor& gate_up_proj, const at::Tensor& down_proj, std::string_view activation) {
  check_defined("fuseops::moe_experts_forward", hidden, top_k_index, top_k_weights, gate_up_proj,
                down_proj);
  static auto op = detail::find_op<decltype(moe_experts_forward)>("fuseops::moe_experts_forward");
  return op.call(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, activation);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_experts_backward(
    const at::Tensor& grad_output, const at::Tensor& hidden, const at::Tensor& top_k_index,
    const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj, const at::Tensor& down_proj,
    std::string_view activation, bool expert_grads, const std::optional<at::Tensor>& gate_up_out) {
  constexpr const char* name = "fuseops::moe_experts_backward";
  check_floating_input(name, "grad_output", grad_output);
  check_defined(name, hidden, top_k_index, top_k_weights, gate_up_proj, down_proj);
  static auto op = detail::find_op<decltype(moe_experts_backward)>("fuseops::moe_experts_backward");
  return op.call(grad_output, hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                 activation, expert_grads, gate_up_out);
}

// No autocast kernel: under autocast the op runs in its inputs' dtypes and
// returns hidden's, as transformers' experts loop returns it (its products
// run in the autocast dtype, its sum in hidden's); on CPUs that emulate
// bfloat16 products, float32 ones are also the faster.

}  // namespace fuseops
