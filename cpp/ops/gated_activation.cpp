// fuseops::swiglu and geglu (separate and packed forms): the C++ API, the
// shared checks and the `*_with` entry points that every backend's kernels go
// through. The schemas and the Meta, CPU and CUDA registrations are generated
// from cpp/ops/gated_activation.yaml. CPU kernels:
// cpp/ops/cpu/gated_activation_kernel.cpp; CUDA: cuda/gated_activation_kernel.cu;
// autograd: cpp/ops/autograd/gated_activation.cpp.

#include "ops/gated_activation.h"

#include <ATen/TensorUtils.h>
#include <torch/library.h>

#include <fuseops/gated_activation.h>

#include "ops/common/autocast.h"
#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/output_memory.h"

namespace fuseops {
namespace detail {
namespace {

int64_t last_dim_size(const at::Tensor& t) { return t.dim() == 0 ? 1 : t.size(-1); }

// `t` as [numel / cols, cols] with contiguous rows: a view when its strides
// allow one (e.g. a half of a packed tensor), else a contiguous copy.
at::Tensor as_rows(const at::Tensor& t, int64_t cols) {
  const int64_t rows = cols == 0 ? 0 : t.numel() / cols;
  const std::vector<int64_t> shape = {rows, cols};
  if (const auto strides = at::detail::computeStride(t.sizes(), t.strides(), shape);
      strides.has_value() && ((*strides)[1] == 1 || cols == 1)) {
    return t.as_strided(shape, {(*strides)[0], 1});
  }
  return t.contiguous().view(shape);
}

void check_gate_and_up(const char* op, const at::Tensor& gate, const at::Tensor& up) {
  check_floating_input(op, "gate", gate);
  check_floating_input(op, "up", up);
  check_same_dtype(op, "up", up, "gate", gate);
  check_same_device(op, "up", up, "gate", gate);
  check_same_shape(op, "up", up, "gate", gate);
}

void check_packed(const char* op, const at::Tensor& input) {
  check_floating_input(op, "input", input);
  TORCH_CHECK(input.dim() >= 1 && input.size(-1) % 2 == 0, op,
              ": argument 'input' must have an even last dimension (the gate half, then the "
              "up half), got shape ",
              input.sizes());
}

std::vector<int64_t> packed_output_shape(const at::Tensor& input) {
  std::vector<int64_t> shape = input.sizes().vec();
  shape.back() /= 2;
  return shape;
}

// The gate and up halves of a packed tensor, as [rows, H] views.
std::pair<at::Tensor, at::Tensor> packed_halves(const at::Tensor& packed) {
  const int64_t hidden = packed.size(-1) / 2;
  const at::Tensor rows = as_rows(packed, 2 * hidden);
  return {rows.narrow(1, 0, hidden), rows.narrow(1, hidden, hidden)};
}

}  // namespace

at::Tensor gated_with(const char* op, const at::Tensor& gate, const at::Tensor& up,
                      Activation activation, GatedKernel kernel) {
  check_gate_and_up(op, gate, up);
  at::Tensor out = detail::empty_output(gate.sizes(), gate.options());
  if (kernel != nullptr && gate.numel() > 0) {
    const int64_t cols = last_dim_size(gate);
    kernel(out.view({-1, cols}), as_rows(gate, cols), as_rows(up, cols), activation);
  }
  return out;
}

at::Tensor& gated_out_with(const char* op, const at::Tensor& gate, const at::Tensor& up,
                           Activation activation, at::Tensor& out, GatedKernel kernel) {
  check_gate_and_up(op, gate, up);
  check_out(op, out, "gate", gate);
  prepare_outputs(op, {{"out", out}}, gate.sizes(), {{"gate", gate}, {"up", up}});
  if (kernel == nullptr || gate.numel() == 0) {
    return out;
  }
  const int64_t cols = last_dim_size(gate);
  const at::Tensor gate_rows = as_rows(gate, cols);
  const at::Tensor up_rows = as_rows(up, cols);
  fill_out(out, {gate_rows, up_rows}, {}, [&](const at::Tensor& target) {
    kernel(target.view({-1, cols}), gate_rows, up_rows, activation);
  });
  return out;
}

namespace {

void check_gated_backward(const char* op, const at::Tensor& grad_output, const at::Tensor& gate,
                          const at::Tensor& up) {
  check_floating_input(op, "grad_output", grad_output);
  check_gate_and_up(op, gate, up);
  check_same_dtype(op, "grad_output", grad_output, "gate", gate);
  check_same_device(op, "grad_output", grad_output, "gate", gate);
  check_same_shape(op, "grad_output", grad_output, "gate", gate);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> gated_backward_with(const char* op,
                                                       const at::Tensor& grad_output,
                                                       const at::Tensor& gate, const at::Tensor& up,
                                                       Activation activation,
                                                       GatedBackwardKernel kernel) {
  check_gated_backward(op, grad_output, gate, up);
  at::Tensor grad_gate = detail::empty_output(gate.sizes(), gate.options());
  at::Tensor grad_up = detail::empty_output(up.sizes(), up.options());
  if (kernel != nullptr && gate.numel() > 0) {
    const int64_t cols = last_dim_size(gate);
    kernel(grad_gate.view({-1, cols}), grad_up.view({-1, cols}), as_rows(grad_output, cols),
           as_rows(gate, cols), as_rows(up, cols), activation);
  }
  return {grad_gate, grad_up};
}

void gated_backward_out_with(const char* op, const at::Tensor& grad_output, const at::Tensor& gate,
                             const at::Tensor& up, Activation activation, at::Tensor& grad_gate,
                             at::Tensor& grad_up, GatedBackwardKernel kernel) {
  check_gated_backward(op, grad_output, gate, up);
  check_out(op, grad_gate, "gate", gate, "grad_gate");
  check_out(op, grad_up, "gate", gate, "grad_up");
  prepare_outputs(op, {{"grad_gate", grad_gate}, {"grad_up", grad_up}}, gate.sizes(),
                  {{"grad_output", grad_output}, {"gate", gate}, {"up", up}});
  if (kernel == nullptr || gate.numel() == 0) {
    return;
  }
  const int64_t cols = last_dim_size(gate);
  const at::Tensor grad_rows = as_rows(grad_output, cols);
  const at::Tensor gate_rows = as_rows(gate, cols);
  const at::Tensor up_rows = as_rows(up, cols);
  // Elementwise: each output may be exactly one of the inputs (the kernel
  // reads element i of all three before it writes element i of either).
  const bool gate_direct = writes_directly(grad_gate, {grad_rows, gate_rows, up_rows}, {});
  const bool up_direct = writes_directly(grad_up, {grad_rows, gate_rows, up_rows}, {});
  const at::Tensor gate_target =
      gate_direct ? grad_gate : detail::empty_output(gate.sizes(), gate.options());
  const at::Tensor up_target =
      up_direct ? grad_up : detail::empty_output(gate.sizes(), gate.options());
  kernel(gate_target.view({-1, cols}), up_target.view({-1, cols}), grad_rows, gate_rows, up_rows,
         activation);
  if (!gate_direct) {
    grad_gate.copy_(gate_target);
  }
  if (!up_direct) {
    grad_up.copy_(up_target);
  }
}

at::Tensor gated_packed_with(const char* op, const at::Tensor& input, Activation activation,
                             GatedKernel kernel) {
  check_packed(op, input);
  at::Tensor out = detail::empty_output(packed_output_shape(input), input.options());
  if (kernel != nullptr && input.numel() > 0) {
    const auto [gate, up] = packed_halves(input);
    kernel(out.view({-1, gate.size(1)}), gate, up, activation);
  }
  return out;
}

at::Tensor& gated_packed_out_with(const char* op, const at::Tensor& input, Activation activation,
                                  at::Tensor& out, GatedKernel kernel) {
  check_packed(op, input);
  check_out(op, out, "input", input);
  prepare_outputs(op, {{"out", out}}, packed_output_shape(input), {{"input", input}});
  if (kernel == nullptr || input.numel() == 0) {
    return out;
  }
  // A half is strided within the packed rows: any overlap with `out` goes
  // through a temporary.
  const auto halves = packed_halves(input);
  const at::Tensor& gate = halves.first;
  const at::Tensor& up = halves.second;
  fill_out(out, {}, {gate, up}, [&](const at::Tensor& target) {
    kernel(target.view({-1, gate.size(1)}), gate, up, activation);
  });
  return out;
}

at::Tensor gated_packed_backward_with(const char* op, const at::Tensor& grad_output,
                                      const at::Tensor& input, Activation activation,
                                      GatedBackwardKernel kernel) {
  check_floating_input(op, "grad_output", grad_output);
  check_packed(op, input);
  check_same_dtype(op, "grad_output", grad_output, "input", input);
  check_same_device(op, "grad_output", grad_output, "input", input);
  const std::vector<int64_t> output_shape = packed_output_shape(input);
  TORCH_CHECK(grad_output.sizes() == at::IntArrayRef(output_shape), op,
              ": argument 'grad_output' must have the shape of the output ",
              at::IntArrayRef(output_shape), " (input ", input.sizes(),
              " with its last dimension halved), got ", grad_output.sizes());
  at::Tensor grad_input = detail::empty_output(input.sizes(), input.options());
  if (kernel != nullptr && input.numel() > 0) {
    const auto [gate, up] = packed_halves(input);
    const auto [grad_gate, grad_up] = packed_halves(grad_input);
    kernel(grad_gate, grad_up, as_rows(grad_output, gate.size(1)), gate, up, activation);
  }
  return grad_input;
}

}  // namespace detail

// C++ API: through the dispatcher, so autograd and the device kernels apply.
// Undefined tensors carry no dispatch key, so they are rejected here, before
// the dispatcher would fail with a message that names no argument.
namespace {

using TensorPair = std::tuple<at::Tensor, at::Tensor>;

void check_defined_pair(const char* op, const at::Tensor& gate, const at::Tensor& up) {
  check_floating_input(op, "gate", gate);
  check_floating_input(op, "up", up);
}

}  // namespace

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  check_defined_pair("fuseops::swiglu", gate, up);
  static auto op = detail::find_op<decltype(swiglu)>("fuseops::swiglu");
  return op.call(gate, up);
}

at::Tensor& swiglu_out(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out) {
  check_defined_pair("fuseops::swiglu.out", gate, up);
  check_out("fuseops::swiglu.out", out, "gate", gate);
  static auto op = detail::find_out_op<decltype(swiglu_out)>("fuseops::swiglu", "out");
  op.call(gate, up, out);
  return out;
}

TensorPair swiglu_backward(const at::Tensor& grad_output, const at::Tensor& gate,
                           const at::Tensor& up) {
  check_floating_input("fuseops::swiglu_backward", "grad_output", grad_output);
  check_defined_pair("fuseops::swiglu_backward", gate, up);
  static auto op = detail::find_op<decltype(swiglu_backward)>("fuseops::swiglu_backward");
  return op.call(grad_output, gate, up);
}

void swiglu_backward_out(const at::Tensor& grad_output, const at::Tensor& gate,
                         const at::Tensor& up, at::Tensor& grad_gate, at::Tensor& grad_up) {
  constexpr const char* name = "fuseops::swiglu_backward.out";
  check_floating_input(name, "grad_output", grad_output);
  check_defined_pair(name, gate, up);
  check_out(name, grad_gate, "gate", gate, "grad_gate");
  check_out(name, grad_up, "gate", gate, "grad_up");
  static auto op =
      detail::find_op<decltype(swiglu_backward_out)>("fuseops::swiglu_backward", "out");
  op.call(grad_output, gate, up, grad_gate, grad_up);
}

at::Tensor swiglu_packed(const at::Tensor& input) {
  check_floating_input("fuseops::swiglu.packed", "input", input);
  static auto op = detail::find_op<decltype(swiglu_packed)>("fuseops::swiglu", "packed");
  return op.call(input);
}

at::Tensor& swiglu_packed_out(const at::Tensor& input, at::Tensor& out) {
  check_floating_input("fuseops::swiglu.packed_out", "input", input);
  check_out("fuseops::swiglu.packed_out", out, "input", input);
  static auto op =
      detail::find_out_op<decltype(swiglu_packed_out)>("fuseops::swiglu", "packed_out");
  op.call(input, out);
  return out;
}

at::Tensor swiglu_packed_backward(const at::Tensor& grad_output, const at::Tensor& input) {
  check_floating_input("fuseops::swiglu_backward.packed", "grad_output", grad_output);
  check_floating_input("fuseops::swiglu_backward.packed", "input", input);
  static auto op =
      detail::find_op<decltype(swiglu_packed_backward)>("fuseops::swiglu_backward", "packed");
  return op.call(grad_output, input);
}

at::Tensor geglu(const at::Tensor& gate, const at::Tensor& up, std::string_view approximate) {
  check_defined_pair("fuseops::geglu", gate, up);
  static auto op = detail::find_op<decltype(geglu)>("fuseops::geglu");
  return op.call(gate, up, approximate);
}

at::Tensor& geglu_out(const at::Tensor& gate, const at::Tensor& up, std::string_view approximate,
                      at::Tensor& out) {
  check_defined_pair("fuseops::geglu.out", gate, up);
  check_out("fuseops::geglu.out", out, "gate", gate);
  static auto op = detail::find_out_op<decltype(geglu_out)>("fuseops::geglu", "out");
  op.call(gate, up, approximate, out);
  return out;
}

TensorPair geglu_backward(const at::Tensor& grad_output, const at::Tensor& gate,
                          const at::Tensor& up, std::string_view approximate) {
  check_floating_input("fuseops::geglu_backward", "grad_output", grad_output);
  check_defined_pair("fuseops::geglu_backward", gate, up);
  static auto op = detail::find_op<decltype(geglu_backward)>("fuseops::geglu_backward");
  return op.call(grad_output, gate, up, approximate);
}

void geglu_backward_out(const at::Tensor& grad_output, const at::Tensor& gate, const at::Tensor& up,
                        std::string_view approximate, at::Tensor& grad_gate, at::Tensor& grad_up) {
  constexpr const char* name = "fuseops::geglu_backward.out";
  check_floating_input(name, "grad_output", grad_output);
  check_defined_pair(name, gate, up);
  check_out(name, grad_gate, "gate", gate, "grad_gate");
  check_out(name, grad_up, "gate", gate, "grad_up");
  static auto op = detail::find_op<decltype(geglu_backward_out)>("fuseops::geglu_backward", "out");
  op.call(grad_output, gate, up, approximate, grad_gate, grad_up);
}

at::Tensor geglu_packed(const at::Tensor& input, std::string_view approximate) {
  check_floating_input("fuseops::geglu.packed", "input", input);
  static auto op = detail::find_op<decltype(geglu_packed)>("fuseops::geglu", "packed");
  return op.call(input, approximate);
}

at::Tensor& geglu_packed_out(const at::Tensor& input, std::string_view approximate,
                             at::Tensor& out) {
  check_floating_input("fuseops::geglu.packed_out", "input", input);
  check_out("fuseops::geglu.packed_out", out, "input", input);
  static auto op = detail::find_out_op<decltype(geglu_packed_out)>("fuseops::geglu", "packed_out");
  op.call(input, approximate, out);
  return out;
}

at::Tensor geglu_packed_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                 std::string_view approximate) {
  check_floating_input("fuseops::geglu_backward.packed", "grad_output", grad_output);
  check_floating_input("fuseops::geglu_backward.packed", "input", input);
  static auto op =
      detail::find_op<decltype(geglu_packed_backward)>("fuseops::geglu_backward", "packed");
  return op.call(grad_output, input, approximate);
}

// Autocast as torch's act(gate) * up: the multiply promotes mixed inputs.
FUSEOPS_AUTOCAST(swiglu, kPromote, kPromote)
FUSEOPS_AUTOCAST(geglu, kPromote, kPromote)

}  // namespace fuseops
