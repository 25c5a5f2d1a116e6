// fuseops::causal_conv1d: the C++ API, the shared checks and the `*_with` entry
// points that every backend's kernels go through. The schemas and the Meta, CPU
// and CUDA registrations are generated from cpp/ops/causal_conv1d.yaml. CPU
// kernels: cpp/ops/cpu/causal_conv1d_kernel.cpp; CUDA:
// cuda/causal_conv1d_kernel.cu; autograd: cpp/ops/autograd/causal_conv1d.cpp.

#include "ops/causal_conv1d.h"

#include <string>

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <fuseops/causal_conv1d.h>

#include "ops/common/autocast.h"
#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/tensors.h"

namespace fuseops {
namespace detail {
namespace {

constexpr const char* kForward = "fuseops::causal_conv1d";
constexpr const char* kOut = "fuseops::causal_conv1d.out";
constexpr const char* kForwardStates = "fuseops::causal_conv1d_forward";
constexpr const char* kBackward = "fuseops::causal_conv1d_backward";
constexpr const char* kUpdate = "fuseops::causal_conv1d_update";

// The kernels accumulate in float32, float64 for float64 input.
at::ScalarType acc_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// None (identity) or SiLU, spelled as the causal-conv1d package accepts it.
bool parse_activation(const char* op, ActivationName activation) {
  if (!activation.has_value()) {
    return false;
  }
  TORCH_CHECK(*activation == "silu" || *activation == "swish", op,
              ": argument 'activation' must be None, 'silu' or 'swish', got '",
              std::string(*activation), "'");
  return true;
}

// weight (dim, width) with width 2..4, in x's dtype or float32 for
// bfloat16/float16 x; bias (dim) in weight's dtype.
void check_params(const char* op, const at::Tensor& x, const at::Tensor& weight,
                  const at::Tensor& bias) {
  const int64_t dim = x.size(1);
  check_floating_input(op, "weight", weight);
  check_same_device(op, "weight", weight, "x", x);
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == dim, op,
              ": argument 'weight' must have shape (dim, width) = (", dim,
              ", width), dim being the size of dimension 1 of 'x', got ", weight.sizes());
  TORCH_CHECK(weight.size(1) >= 2 && weight.size(1) <= 4, op,
              ": argument 'weight' must have width (its dimension 1) 2, 3 or 4, got ",
              weight.size(1));
  const bool reduced = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  TORCH_CHECK(
      weight.scalar_type() == x.scalar_type() || (reduced && weight.scalar_type() == at::kFloat),
      op, ": argument 'weight' must have the dtype of 'x' (", x.scalar_type(), ")",
      reduced ? " or float32" : "", ", got ", weight.scalar_type());
  if (bias.defined()) {
    check_floating_input(op, "bias", bias);
    check_same_dtype(op, "bias", bias, "weight", weight);
    check_same_device(op, "bias", bias, "weight", weight);
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == dim, op,
                ": argument 'bias' must have shape (dim) = (", dim, "), got ", bias.sizes());
  }
}

// x (batch, dim, seqlen), then its parameters.
void check_conv_args(const char* op, const at::Tensor& x, const at::Tensor& weight,
                     const at::Tensor& bias) {
  check_floating_input(op, "x", x);
  TORCH_CHECK(x.dim() == 3, op,
              ": argument 'x' must have 3 dimensions (batch, dim, seqlen), got shape ", x.sizes());
  check_params(op, x, weight, bias);
}

// initial_states, grad_final_states: (batch, dim, width - 1) in x's dtype.
void check_states(const char* op, const char* arg, const at::Tensor& states, const at::Tensor& x,
                  int64_t width) {
  if (!states.defined()) {
    return;
  }
  check_floating_input(op, arg, states);
  check_same_dtype(op, arg, states, "x", x);
  check_same_device(op, arg, states, "x", x);
  TORCH_CHECK(states.dim() == 3 && states.size(0) == x.size(0) && states.size(1) == x.size(1) &&
                  states.size(2) == width - 1,
              op, ": argument '", arg, "' must have shape (batch, dim, width - 1) = (", x.size(0),
              ", ", x.size(1), ", ", width - 1, "), got ", states.sizes());
}

// The layout the kernels read x in: channel-last when channels are
// contiguous (and time is not), rows when time is contiguous; any other x is
// copied to rows.
ConvLayout layout_of(const at::Tensor& x) {
  const bool time_contiguous = x.size(2) > 1 && x.stride(2) == 1;
  return x.size(1) > 1 && x.stride(1) == 1 && !time_contiguous ? ConvLayout::kChannelLast
                                                               : ConvLayout::kRows;
}

at::Tensor readable_in(const at::Tensor& x, ConvLayout layout) {
  if (layout == ConvLayout::kChannelLast || x.size(2) == 1 || x.stride(2) == 1) {
    return x;
  }
  return x.contiguous();
}

// A new (batch, dim, k) tensor dense in `layout`.
at::Tensor empty_in(int64_t batch, int64_t dim, int64_t k, const at::TensorOptions& options,
                    ConvLayout layout) {
  if (layout == ConvLayout::kChannelLast) {
    return empty_output({batch, k, dim}, options).transpose(1, 2);
  }
  return empty_output({batch, dim, k}, options);
}

// `t` dense in `layout` (itself when it already is).
at::Tensor dense_in(const at::Tensor& t, ConvLayout layout) {
  if (!t.defined()) {
    return t;
  }
  if (layout == ConvLayout::kChannelLast) {
    return t.transpose(1, 2).contiguous().transpose(1, 2);
  }
  return t.contiguous();
}

bool is_dense_in(const at::Tensor& t, ConvLayout layout) {
  return layout == ConvLayout::kChannelLast ? t.transpose(1, 2).is_contiguous() : t.is_contiguous();
}

at::Tensor acc_param(const at::Tensor& param, const at::Tensor& x) {
  return param.defined() ? param.to(acc_dtype(x)).contiguous() : param;
}

// The last width-1 inputs of initial_states ++ x (zeros for absent states).
at::Tensor final_states(const at::Tensor& x, const at::Tensor& initial_states, int64_t width,
                        ConvLayout layout, bool compute) {
  const int64_t k = width - 1;
  const int64_t seqlen = x.size(2);
  at::Tensor result = empty_in(x.size(0), x.size(1), k, x.options(), layout);
  if (!compute || result.numel() == 0) {
    return result;
  }
  if (seqlen >= k) {
    result.copy_(x.narrow(2, seqlen - k, k));
    return result;
  }
  const int64_t from_states = k - seqlen;
  if (initial_states.defined()) {
    result.narrow(2, 0, from_states).copy_(initial_states.narrow(2, seqlen, from_states));
  } else {
    result.narrow(2, 0, from_states).zero_();
  }
  result.narrow(2, from_states, seqlen).copy_(x);
  return result;
}

struct Prepared {
  at::Tensor x;  // readable by the kernels in `layout`
  ConvLayout layout;
  at::Tensor weight, bias, initial_states;  // as the kernels take them
  bool silu;
};

Prepared prepare(const char* op, const at::Tensor& x, const at::Tensor& weight,
                 const OptionalTensor& bias, const OptionalTensor& initial_states,
                 ActivationName activation, bool compute) {
  const at::Tensor b = undefined_if_none(bias);
  const at::Tensor init = undefined_if_none(initial_states);
  check_conv_args(op, x, weight, b);
  check_states(op, "initial_states", init, x, weight.size(1));
  Prepared p;
  p.silu = parse_activation(op, activation);
  p.layout = layout_of(x);
  if (compute) {
    p.x = readable_in(x, p.layout);
    p.weight = acc_param(weight, x);
    p.bias = acc_param(b, x);
    p.initial_states = dense_in(init, p.layout);
  }
  return p;
}

void run_forward(CausalConv1dKernel kernel, const at::Tensor& out, const Prepared& p) {
  if (kernel != nullptr && p.x.numel() > 0) {
    kernel(out, p.x, p.weight, p.bias, p.initial_states, p.silu, p.layout);
  }
}

// Fake tensors traced with dynamic shapes hold no data and have no concrete
// layout to reason about; functionalization has already removed their
// aliasing.
bool symbolic(const at::Tensor& t) {
  return t.defined() && t.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
}

}  // namespace

at::Tensor causal_conv1d_with(const at::Tensor& x, const at::Tensor& weight,
                              const OptionalTensor& bias, const OptionalTensor& initial_states,
                              ActivationName activation, CausalConv1dKernel kernel) {
  const Prepared p =
      prepare(kForward, x, weight, bias, initial_states, activation, kernel != nullptr);
  at::Tensor out = empty_in(x.size(0), x.size(1), x.size(2), x.options(), p.layout);
  run_forward(kernel, out, p);
  return out;
}

at::Tensor& causal_conv1d_out_with(const at::Tensor& x, const at::Tensor& weight,
                                   const OptionalTensor& bias, const OptionalTensor& initial_states,
                                   ActivationName activation, at::Tensor& out,
                                   CausalConv1dKernel kernel) {
  const Prepared p = prepare(kOut, x, weight, bias, initial_states, activation, kernel != nullptr);
  check_out(kOut, out, "x", x);
  const at::Tensor b = undefined_if_none(bias);
  const at::Tensor init = undefined_if_none(initial_states);
  prepare_outputs(kOut, {{"out", out}}, x.sizes(),
                  {{"x", x}, {"weight", weight}, {"bias", b}, {"initial_states", init}});
  if (kernel == nullptr || x.numel() == 0) {
    return out;
  }
  // out[t] depends on x[t - width + 1 .. t], so no overlap with an input is
  // written in place; an out of the kernel's layout that shares nothing is.
  const bool direct = is_dense_in(out, p.layout) && !share_memory(out, x) &&
                      !share_memory(out, weight) && !share_memory(out, b) &&
                      !share_memory(out, init);
  if (direct) {
    run_forward(kernel, out, p);
  } else {
    at::Tensor result = empty_in(x.size(0), x.size(1), x.size(2), x.options(), p.layout);
    run_forward(kernel, result, p);
    out.copy_(result);
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor> causal_conv1d_forward_with(
    const at::Tensor& x, const at::Tensor& weight, const OptionalTensor& bias,
    const OptionalTensor& initial_states, ActivationName activation, CausalConv1dKernel kernel) {
  const Prepared p =
      prepare(kForwardStates, x, weight, bias, initial_states, activation, kernel != nullptr);
  at::Tensor out = empty_in(x.size(0), x.size(1), x.size(2), x.options(), p.layout);
  run_forward(kernel, out, p);
  at::Tensor states = final_states(x, undefined_if_none(initial_states), weight.size(1), p.layout,
                                   kernel != nullptr);
  return {out, states};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> causal_conv1d_backward_with(
    const at::Tensor& grad_output, const at::Tensor& x, const at::Tensor& weight,
    const OptionalTensor& bias, const OptionalTensor& initial_states,
    const OptionalTensor& grad_final_states, ActivationName activation,
    CausalConv1dBackwardKernel kernel) {
  const bool compute = kernel != nullptr;
  const Prepared p = prepare(kBackward, x, weight, bias, initial_states, activation, compute);
  check_floating_input(kBackward, "grad_output", grad_output);
  check_same_dtype(kBackward, "grad_output", grad_output, "x", x);
  check_same_device(kBackward, "grad_output", grad_output, "x", x);
  check_same_shape(kBackward, "grad_output", grad_output, "x", x);
  const at::Tensor grad_final = undefined_if_none(grad_final_states);
  check_states(kBackward, "grad_final_states", grad_final, x, weight.size(1));

  const int64_t batch = x.size(0);
  const int64_t dim = x.size(1);
  const int64_t seqlen = x.size(2);
  const int64_t width = weight.size(1);
  at::Tensor grad_x = empty_in(batch, dim, seqlen, x.options(), p.layout);
  at::Tensor grad_init = empty_in(batch, dim, width - 1, x.options(), p.layout);
  if (!compute) {
    return {grad_x, empty_output({dim, width}, weight.options()),
            empty_output({dim}, weight.options()), grad_init};
  }
  const auto acc_options = x.options().dtype(acc_dtype(x));
  at::Tensor grad_weight = empty_output({dim, width}, acc_options);
  at::Tensor grad_bias = empty_output({dim}, acc_options);
  if (x.numel() == 0) {
    // No outputs: only the final states' gradient reaches the inputs (the
    // initial states, when the sequence is empty).
    grad_weight.zero_();
    grad_bias.zero_();
    if (grad_final.defined() && seqlen == 0) {
      grad_init.copy_(grad_final);
    } else {
      grad_init.zero_();
    }
  } else {
    kernel(grad_x, grad_weight, grad_bias, grad_init, dense_in(grad_output, p.layout), p.x,
           p.weight, p.bias, p.initial_states, dense_in(grad_final, p.layout), p.silu, p.layout);
  }
  return {grad_x, grad_weight.to(weight.scalar_type()), grad_bias.to(weight.scalar_type()),
          grad_init};
}

at::Tensor causal_conv1d_update_with(const at::Tensor& x, const at::Tensor& conv_state,
                                     const at::Tensor& weight, const OptionalTensor& bias,
                                     ActivationName activation, CausalConv1dUpdateKernel kernel) {
  check_floating_input(kUpdate, "x", x);
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3, kUpdate,
              ": argument 'x' must have shape (batch, dim) or (batch, dim, seqlen), got ",
              x.sizes());
  const at::Tensor b = undefined_if_none(bias);
  check_params(kUpdate, x, weight, b);
  const bool silu = parse_activation(kUpdate, activation);
  check_floating_input(kUpdate, "conv_state", conv_state);
  check_same_dtype(kUpdate, "conv_state", conv_state, "x", x);
  check_same_device(kUpdate, "conv_state", conv_state, "x", x);
  const int64_t width = weight.size(1);
  TORCH_CHECK(conv_state.dim() == 3 && conv_state.size(0) == x.size(0) &&
                  conv_state.size(1) == x.size(1) && conv_state.size(2) >= width - 1,
              kUpdate, ": argument 'conv_state' must have shape (batch, dim, state_len) = (",
              x.size(0), ", ", x.size(1), ", state_len) with state_len >= width - 1 = ", width - 1,
              ", got ", conv_state.sizes());
  TORCH_CHECK(symbolic(conv_state) || at::has_internal_overlap(conv_state) != at::MemOverlap::Yes,
              kUpdate,
              ": argument 'conv_state' is written in place and must not have elements that "
              "share memory (as an expand()ed tensor does), got strides ",
              conv_state.strides());
  for (const auto& [name, input] :
       {std::pair<const char*, const at::Tensor*>{"x", &x}, {"weight", &weight}, {"bias", &b}}) {
    TORCH_CHECK(!share_memory(*input, conv_state), kUpdate, ": argument '", name,
                "' shares memory with 'conv_state', which the op shifts in place; pass a '", name,
                "' that does not overlap 'conv_state'");
  }
  at::Tensor out = empty_output(x.sizes(), x.options());
  if (kernel != nullptr && x.numel() > 0) {
    // Kernels take (batch, dim, seqlen): a (batch, dim) step is seqlen 1.
    auto as_3d = [](const at::Tensor& t) { return t.dim() == 2 ? t.unsqueeze(-1) : t; };
    kernel(as_3d(out), as_3d(x), conv_state, acc_param(weight, x), acc_param(b, x), silu);
  }
  return out;
}

}  // namespace detail

// C++ API: through the dispatcher, so autograd and the device kernels apply.
// Undefined tensors carry no dispatch key, so they are rejected here, before
// the dispatcher would fail with a message that names no argument.
at::Tensor causal_conv1d(const at::Tensor& x, const at::Tensor& weight,
                         const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& initial_states,
                         std::optional<std::string_view> activation) {
  check_floating_input(detail::kForward, "x", x);
  check_floating_input(detail::kForward, "weight", weight);
  static auto op = detail::find_op<decltype(causal_conv1d)>(detail::kForward);
  return op.call(x, weight, bias, initial_states, activation);
}

at::Tensor& causal_conv1d_out(const at::Tensor& x, const at::Tensor& weight,
                              const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& initial_states,
                              std::optional<std::string_view> activation, at::Tensor& out) {
  check_floating_input(detail::kOut, "x", x);
  check_floating_input(detail::kOut, "weight", weight);
  check_out(detail::kOut, out, "x", x);
  static auto op = detail::find_out_op<decltype(causal_conv1d_out)>(detail::kForward, "out");
  op.call(x, weight, bias, initial_states, activation, out);
  return out;
}

std::tuple<at::Tensor, at::Tensor> causal_conv1d_forward(
    const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& initial_states, std::optional<std::string_view> activation) {
  check_floating_input(detail::kForwardStates, "x", x);
  check_floating_input(detail::kForwardStates, "weight", weight);
  static auto op = detail::find_op<decltype(causal_conv1d_forward)>(detail::kForwardStates);
  return op.call(x, weight, bias, initial_states, activation);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> causal_conv1d_backward(
    const at::Tensor& grad_output, const at::Tensor& x, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& initial_states,
    const std::optional<at::Tensor>& grad_final_states,
    std::optional<std::string_view> activation) {
  check_floating_input(detail::kBackward, "grad_output", grad_output);
  check_floating_input(detail::kBackward, "x", x);
  check_floating_input(detail::kBackward, "weight", weight);
  static auto op = detail::find_op<decltype(causal_conv1d_backward)>(detail::kBackward);
  return op.call(grad_output, x, weight, bias, initial_states, grad_final_states, activation);
}

at::Tensor causal_conv1d_update(const at::Tensor& x, at::Tensor& conv_state,
                                const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                std::optional<std::string_view> activation) {
  check_floating_input(detail::kUpdate, "x", x);
  check_floating_input(detail::kUpdate, "conv_state", conv_state);
  check_floating_input(detail::kUpdate, "weight", weight);
  static auto op = detail::find_op<decltype(causal_conv1d_update)>(detail::kUpdate);
  return op.call(x, conv_state, weight, bias, activation);
}

// Autocast as torch's conv1d: computed in the autocast dtype on CPU and CUDA.
FUSEOPS_AUTOCAST(causal_conv1d, kLowerPrecision, kLowerPrecision)

}  // namespace fuseops
