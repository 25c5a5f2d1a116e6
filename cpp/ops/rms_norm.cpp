// fuseops::rms_norm and fuseops::fused_add_rms_norm: the C++ API, the shared
// checks and the `*_with` entry points that every backend's kernels go through.
// The schemas and the Meta, CPU and CUDA registrations are generated from
// cpp/ops/rms_norm.yaml. CPU kernels: cpp/ops/cpu/rms_norm_kernel.cpp; CUDA:
// cuda/rms_norm_kernel.cu; autograd: cpp/ops/autograd/rms_norm.cpp.

#include "ops/rms_norm.h"

#include <cfloat>
#include <limits>

#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <fuseops/rms_norm.h>

#include "ops/common/autocast.h"
#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/tensors.h"

namespace fuseops {
namespace detail {
namespace {

void check_input(const char* op, const at::Tensor& input) {
  check_floating_input(op, "input", input);
  TORCH_CHECK(input.dim() >= 1, op,
              ": argument 'input' must have at least 1 dimension (the normalized "
              "one), got a 0-dimensional tensor");
}

// The weight as given (undefined for None), after checking it against input.
at::Tensor checked_weight(const char* op, const at::Tensor& input,
                          const std::optional<at::Tensor>& weight_opt) {
  at::Tensor weight = undefined_if_none(weight_opt);
  if (!weight.defined()) {
    return weight;
  }
  check_floating_input(op, "weight", weight);
  check_same_device(op, "weight", weight, "input", input);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == input.size(-1), op,
              ": argument 'weight' must have shape [", input.size(-1),
              "] (the last dimension of 'input'), got ", weight.sizes());
  return weight;
}

at::ScalarType opmath_dtype(const at::Tensor& input) {
  return at::toOpMathType(input.scalar_type());
}

// Kernels read the weight in the computation dtype: one conversion of a
// (hidden,) vector per call instead of one per row.
at::Tensor kernel_weight(const at::Tensor& weight, at::ScalarType opmath) {
  return weight.defined() ? weight.to(opmath).contiguous() : weight;
}

// The forward kernels' weight. The CPU ones also read a weight of the
// input's own dtype as it is (widening it as they load it: the same values),
// so that a call converts nothing: a decode step's norms, one row each, spent
// more on the conversion than on the row.
at::Tensor forward_kernel_weight(const at::Tensor& weight, const at::Tensor& input) {
  if (weight.defined() && input.device().is_cpu() && weight.scalar_type() == input.scalar_type()) {
    return weight.contiguous();
  }
  return kernel_weight(weight, opmath_dtype(input));
}

at::Tensor empty_rstd(const at::Tensor& input) {
  return detail::empty_output(input.sizes().slice(0, input.dim() - 1),
                              input.options().dtype(opmath_dtype(input)));
}

int64_t hidden_size(const at::Tensor& input) { return input.size(-1); }

void check_residual(const char* op, const at::Tensor& input, const at::Tensor& residual) {
  check_floating_input(op, "residual", residual);
  check_same_dtype(op, "residual", residual, "input", input);
  check_same_device(op, "residual", residual, "input", input);
  check_same_shape(op, "residual", residual, "input", input);
}

void check_rstd(const char* op, const at::Tensor& input, const at::Tensor& rstd) {
  check_defined(op, "rstd", rstd);
  TORCH_CHECK(rstd.scalar_type() == opmath_dtype(input), op, ": argument 'rstd' must have dtype ",
              opmath_dtype(input), " (the computation dtype of 'input'), got ", rstd.scalar_type());
  check_same_device(op, "rstd", rstd, "input", input);
  TORCH_CHECK(rstd.sizes() == input.sizes().slice(0, input.dim() - 1), op,
              ": argument 'rstd' must have shape ", input.sizes().slice(0, input.dim() - 1),
              " (the rows of 'input'), got ", rstd.sizes());
}

// A row of width zero has mean(x^2) = 0/0, as in PyTorch.
void fill_rstd_of_empty_rows(const at::Tensor& rstd) {
  if (rstd.defined() && rstd.numel() > 0) {
    rstd.fill_(std::numeric_limits<double>::quiet_NaN());
  }
}

struct ForwardResult {
  at::Tensor out;
  at::Tensor new_residual;
  at::Tensor rstd;
};

// The allocating forward of both ops; `residual` is undefined for rms_norm.
ForwardResult forward(const char* op, const at::Tensor& input, const at::Tensor& residual,
                      const std::optional<at::Tensor>& weight_opt, std::optional<double> eps,
                      bool want_rstd, RmsNormForwardKernel kernel) {
  check_input(op, input);
  if (residual.defined()) {
    check_residual(op, input, residual);
  }
  const at::Tensor weight = checked_weight(op, input, weight_opt);
  ForwardResult result;
  result.out = empty_contiguous_like(input);
  if (residual.defined()) {
    result.new_residual = empty_contiguous_like(input);
  }
  if (want_rstd) {
    result.rstd = empty_rstd(input);
  }
  if (kernel == nullptr) {
    return result;
  }
  if (input.numel() == 0) {
    fill_rstd_of_empty_rows(result.rstd);
    return result;
  }
  kernel({result.out, result.rstd, input.contiguous(),
          residual.defined() ? residual.contiguous() : residual, result.new_residual,
          forward_kernel_weight(weight, input), resolve_eps(eps, input)});
  return result;
}

struct BackwardResult {
  at::Tensor grad_input;
  at::Tensor grad_weight;
};

// The checks of a backward call; returns the weight (undefined for none).
at::Tensor check_backward(const char* op, const at::Tensor& grad_output,
                          const at::Tensor& grad_residual, const char* input_name,
                          const at::Tensor& input, const std::optional<at::Tensor>& weight_opt,
                          const at::Tensor& rstd) {
  check_floating_input(op, "grad_output", grad_output);
  check_floating_input(op, input_name, input);
  TORCH_CHECK(input.dim() >= 1, op, ": argument '", input_name,
              "' must have at least 1 dimension, got a 0-dimensional tensor");
  check_same_dtype(op, "grad_output", grad_output, input_name, input);
  check_same_device(op, "grad_output", grad_output, input_name, input);
  check_same_shape(op, "grad_output", grad_output, input_name, input);
  if (grad_residual.defined()) {
    check_floating_input(op, "grad_new_residual", grad_residual);
    check_same_dtype(op, "grad_new_residual", grad_residual, input_name, input);
    check_same_device(op, "grad_new_residual", grad_residual, input_name, input);
    check_same_shape(op, "grad_new_residual", grad_residual, input_name, input);
  }
  const at::Tensor weight = checked_weight(op, input, weight_opt);
  check_rstd(op, input, rstd);
  return weight;
}

// `grad_input_target`, when defined, is where grad_input goes (contiguous,
// input's shape; it may be exactly grad_output, grad_residual or input: the
// kernel reads a row's element before writing it); otherwise grad_input is
// allocated.
BackwardResult backward(const char* op, const at::Tensor& grad_output,
                        const at::Tensor& grad_residual, const char* input_name,
                        const at::Tensor& input, const std::optional<at::Tensor>& weight_opt,
                        const at::Tensor& rstd, RmsNormBackwardKernel kernel,
                        const at::Tensor& grad_input_target = at::Tensor()) {
  const at::Tensor weight =
      check_backward(op, grad_output, grad_residual, input_name, input, weight_opt, rstd);
  BackwardResult result;
  result.grad_input =
      grad_input_target.defined() ? grad_input_target : empty_contiguous_like(input);
  if (!weight.defined()) {
    result.grad_weight = detail::empty_output({0}, input.options());
  }
  if (kernel == nullptr) {
    if (weight.defined()) {
      result.grad_weight = empty_contiguous_like(weight);
    }
    return result;
  }
  const at::ScalarType opmath = opmath_dtype(input);
  at::Tensor grad_weight_opmath;
  if (weight.defined()) {
    grad_weight_opmath = empty_output({hidden_size(input)}, input.options().dtype(opmath)).zero_();
  }
  if (input.numel() > 0) {
    kernel({result.grad_input, grad_weight_opmath, grad_output.contiguous(),
            grad_residual.defined() ? grad_residual.contiguous() : grad_residual,
            input.contiguous(), kernel_weight(weight, opmath), rstd.contiguous()});
  }
  if (weight.defined()) {
    result.grad_weight = grad_weight_opmath.to(weight.scalar_type());
  }
  return result;
}

}  // namespace

double resolve_eps(std::optional<double> eps, const at::Tensor& input) {
  if (eps.has_value()) {
    return *eps;
  }
  return opmath_dtype(input) == at::kDouble ? DBL_EPSILON : FLT_EPSILON;
}

at::Tensor rms_norm_with(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                         std::optional<double> eps, RmsNormForwardKernel kernel) {
  return forward("fuseops::rms_norm", input, at::Tensor(), weight, eps, false, kernel).out;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_forward_with(const at::Tensor& input,
                                                         const std::optional<at::Tensor>& weight,
                                                         std::optional<double> eps,
                                                         RmsNormForwardKernel kernel) {
  ForwardResult r =
      forward("fuseops::rms_norm_forward", input, at::Tensor(), weight, eps, true, kernel);
  return {r.out, r.rstd};
}

void rms_norm_out_with(const at::Tensor& input, const std::optional<at::Tensor>& weight_opt,
                       std::optional<double> eps, at::Tensor& out, RmsNormForwardKernel kernel) {
  constexpr const char* op = "fuseops::rms_norm.out";
  check_input(op, input);
  const at::Tensor weight = checked_weight(op, input, weight_opt);
  check_out(op, out, "input", input);
  prepare_outputs(op, {{"out", out}}, input.sizes(), {{"input", input}, {"weight", weight}});
  if (kernel == nullptr || input.numel() == 0) {
    return;
  }
  const at::Tensor contiguous_input = input.contiguous();
  const at::Tensor weight_for_kernel = forward_kernel_weight(weight, input);
  const double eps_value = resolve_eps(eps, input);
  // Each row is read whole (for its mean square) before it is written.
  fill_out(out, {contiguous_input}, {weight_for_kernel}, [&](const at::Tensor& target) {
    kernel({target, at::Tensor(), contiguous_input, at::Tensor(), at::Tensor(), weight_for_kernel,
            eps_value});
  });
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_with(const at::Tensor& grad_output,
                                                          const at::Tensor& input,
                                                          const std::optional<at::Tensor>& weight,
                                                          const at::Tensor& rstd,
                                                          RmsNormBackwardKernel kernel) {
  BackwardResult r = backward("fuseops::rms_norm_backward", grad_output, at::Tensor(), "input",
                              input, weight, rstd, kernel);
  return {r.grad_input, r.grad_weight};
}

namespace {

// The out= backward of both ops; `grad_residual` is undefined for rms_norm.
void backward_out(const char* op, const at::Tensor& grad_output, const at::Tensor& grad_residual,
                  const char* input_name, const at::Tensor& input,
                  const std::optional<at::Tensor>& weight, const at::Tensor& rstd,
                  at::Tensor& grad_input, at::Tensor& grad_weight, RmsNormBackwardKernel kernel) {
  const at::Tensor weight_or_undefined =
      check_backward(op, grad_output, grad_residual, input_name, input, weight, rstd);
  const bool has_weight = weight_or_undefined.defined();
  check_out(op, grad_input, input_name, input, "grad_input");
  check_out(op, grad_weight, has_weight ? "weight" : input_name,
            has_weight ? weight_or_undefined : input, "grad_weight");
  TORCH_CHECK(!share_memory(grad_input, grad_weight), op,
              ": arguments 'grad_input' and 'grad_weight' share memory; each result needs its "
              "own tensor");
  prepare_outputs(op, {{"grad_input", grad_input}}, input.sizes(),
                  {{"grad_output", grad_output},
                   {"grad_new_residual", grad_residual},
                   {input_name, input},
                   {"rstd", rstd},
                   {"weight", weight_or_undefined},
                   {"grad_weight", grad_weight}});
  prepare_outputs(op, {{"grad_weight", grad_weight}}, {has_weight ? input.size(-1) : 0},
                  {{"grad_output", grad_output},
                   {"grad_new_residual", grad_residual},
                   {input_name, input},
                   {"rstd", rstd},
                   {"weight", weight_or_undefined},
                   {"grad_input", grad_input}});
  if (kernel == nullptr) {
    return;
  }
  // Row-wise: grad_input may be exactly grad_output, grad_residual or input.
  BackwardResult r;
  fill_out(grad_input, {grad_output, grad_residual, input},
           {rstd, weight_or_undefined, grad_weight}, [&](const at::Tensor& target) {
             r = backward(op, grad_output, grad_residual, input_name, input, weight, rstd, kernel,
                          target);
           });
  if (has_weight) {
    grad_weight.copy_(r.grad_weight);
  }
}

}  // namespace

void rms_norm_backward_out_with(const at::Tensor& grad_output, const at::Tensor& input,
                                const std::optional<at::Tensor>& weight, const at::Tensor& rstd,
                                at::Tensor& grad_input, at::Tensor& grad_weight,
                                RmsNormBackwardKernel kernel) {
  backward_out("fuseops::rms_norm_backward.out", grad_output, at::Tensor(), "input", input, weight,
               rstd, grad_input, grad_weight, kernel);
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_with(const at::Tensor& input,
                                                           const at::Tensor& residual,
                                                           const std::optional<at::Tensor>& weight,
                                                           std::optional<double> eps,
                                                           RmsNormForwardKernel kernel) {
  ForwardResult r =
      forward("fuseops::fused_add_rms_norm", input, residual, weight, eps, false, kernel);
  return {r.out, r.new_residual};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_forward_with(
    const at::Tensor& input, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    std::optional<double> eps, RmsNormForwardKernel kernel) {
  ForwardResult r =
      forward("fuseops::fused_add_rms_norm_forward", input, residual, weight, eps, true, kernel);
  return {r.out, r.new_residual, r.rstd};
}

void fused_add_rms_norm_out_with(const at::Tensor& input, const at::Tensor& residual,
                                 const std::optional<at::Tensor>& weight_opt,
                                 std::optional<double> eps, at::Tensor& out,
                                 at::Tensor& residual_out, RmsNormForwardKernel kernel) {
  constexpr const char* op = "fuseops::fused_add_rms_norm.out";
  check_input(op, input);
  check_residual(op, input, residual);
  const at::Tensor weight = checked_weight(op, input, weight_opt);
  check_out(op, out, "input", input);
  check_defined(op, "residual_out", residual_out);
  check_same_dtype(op, "residual_out", residual_out, "input", input);
  check_same_device(op, "residual_out", residual_out, "input", input);
  prepare_outputs(op, {{"out", out}, {"residual_out", residual_out}}, input.sizes(),
                  {{"input", input}, {"residual", residual}, {"weight", weight}});
  if (kernel == nullptr || input.numel() == 0) {
    return;
  }
  const at::Tensor contiguous_input = input.contiguous();
  const at::Tensor contiguous_residual = residual.contiguous();
  const at::Tensor weight_for_kernel = forward_kernel_weight(weight, input);
  const double eps_value = resolve_eps(eps, input);
  // Each output is written in place when it can be: `out` and
  // `residual_out` may be `input` and `residual` themselves, either way
  // round: the kernel reads each element of both before it writes that
  // element of `residual_out`, and writes `out` from `residual_out`.
  const bool out_direct =
      writes_directly(out, {contiguous_input, contiguous_residual}, {weight_for_kernel});
  const bool residual_direct =
      writes_directly(residual_out, {contiguous_input, contiguous_residual}, {weight_for_kernel});
  const at::Tensor out_target = out_direct ? out : empty_contiguous_like(input);
  const at::Tensor residual_target = residual_direct ? residual_out : empty_contiguous_like(input);
  kernel({out_target, at::Tensor(), contiguous_input, contiguous_residual, residual_target,
          weight_for_kernel, eps_value});
  if (!residual_direct) {
    residual_out.copy_(residual_target);
  }
  if (!out_direct) {
    out.copy_(out_target);
  }
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_backward_with(
    const at::Tensor& grad_output, const std::optional<at::Tensor>& grad_new_residual,
    const at::Tensor& new_residual, const std::optional<at::Tensor>& weight, const at::Tensor& rstd,
    RmsNormBackwardKernel kernel) {
  BackwardResult r = backward("fuseops::fused_add_rms_norm_backward", grad_output,
                              undefined_if_none(grad_new_residual), "new_residual", new_residual,
                              weight, rstd, kernel);
  return {r.grad_input, r.grad_weight};
}

void fused_add_rms_norm_backward_out_with(const at::Tensor& grad_output,
                                          const std::optional<at::Tensor>& grad_new_residual,
                                          const at::Tensor& new_residual,
                                          const std::optional<at::Tensor>& weight,
                                          const at::Tensor& rstd, at::Tensor& grad_input,
                                          at::Tensor& grad_weight, RmsNormBackwardKernel kernel) {
  backward_out("fuseops::fused_add_rms_norm_backward.out", grad_output,
               undefined_if_none(grad_new_residual), "new_residual", new_residual, weight, rstd,
               grad_input, grad_weight, kernel);
}

}  // namespace detail

// C++ API: through the dispatcher, so autograd and the device kernels apply.
// Undefined tensors carry no dispatch key, so they are rejected here, before
// the dispatcher would fail with a message that names no argument; an
// undefined weight means no weight.
using detail::find_op;
using detail::find_out_op;
using detail::none_if_undefined;

at::Tensor rms_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                    std::optional<double> eps) {
  check_floating_input("fuseops::rms_norm", "input", input);
  static auto op = find_op<decltype(rms_norm)>("fuseops::rms_norm");
  return op.call(input, none_if_undefined(weight), eps);
}

at::Tensor& rms_norm_out(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                         std::optional<double> eps, at::Tensor& out) {
  check_floating_input("fuseops::rms_norm.out", "input", input);
  check_out("fuseops::rms_norm.out", out, "input", input);
  static auto op = find_out_op<decltype(rms_norm_out)>("fuseops::rms_norm", "out");
  op.call(input, none_if_undefined(weight), eps, out);
  return out;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& input,
                                                    const std::optional<at::Tensor>& weight,
                                                    std::optional<double> eps) {
  check_floating_input("fuseops::rms_norm_forward", "input", input);
  static auto op = find_op<decltype(rms_norm_forward)>("fuseops::rms_norm_forward");
  return op.call(input, none_if_undefined(weight), eps);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad_output,
                                                     const at::Tensor& input,
                                                     const std::optional<at::Tensor>& weight,
                                                     const at::Tensor& rstd) {
  constexpr const char* name = "fuseops::rms_norm_backward";
  check_floating_input(name, "grad_output", grad_output);
  check_floating_input(name, "input", input);
  static auto op = find_op<decltype(rms_norm_backward)>(name);
  return op.call(grad_output, input, none_if_undefined(weight), rstd);
}

void rms_norm_backward_out(const at::Tensor& grad_output, const at::Tensor& input,
                           const std::optional<at::Tensor>& weight, const at::Tensor& rstd,
                           at::Tensor& grad_input, at::Tensor& grad_weight) {
  constexpr const char* name = "fuseops::rms_norm_backward.out";
  check_floating_input(name, "grad_output", grad_output);
  check_floating_input(name, "input", input);
  static auto op = find_op<decltype(rms_norm_backward_out)>("fuseops::rms_norm_backward", "out");
  op.call(grad_output, input, none_if_undefined(weight), rstd, grad_input, grad_weight);
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& input,
                                                      const at::Tensor& residual,
                                                      const std::optional<at::Tensor>& weight,
                                                      std::optional<double> eps) {
  constexpr const char* name = "fuseops::fused_add_rms_norm";
  check_floating_input(name, "input", input);
  check_floating_input(name, "residual", residual);
  static auto op = find_op<decltype(fused_add_rms_norm)>(name);
  return op.call(input, residual, none_if_undefined(weight), eps);
}

std::tuple<at::Tensor&, at::Tensor&> fused_add_rms_norm_out(
    const at::Tensor& input, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    std::optional<double> eps, at::Tensor& out, at::Tensor& residual_out) {
  constexpr const char* name = "fuseops::fused_add_rms_norm.out";
  check_floating_input(name, "input", input);
  check_floating_input(name, "residual", residual);
  check_out(name, out, "input", input);
  static auto op =
      find_out_op<decltype(fused_add_rms_norm_out)>("fuseops::fused_add_rms_norm", "out");
  op.call(input, residual, none_if_undefined(weight), eps, out, residual_out);
  return {out, residual_out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_forward(
    const at::Tensor& input, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    std::optional<double> eps) {
  constexpr const char* name = "fuseops::fused_add_rms_norm_forward";
  check_floating_input(name, "input", input);
  check_floating_input(name, "residual", residual);
  static auto op = find_op<decltype(fused_add_rms_norm_forward)>(name);
  return op.call(input, residual, none_if_undefined(weight), eps);
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_backward(
    const at::Tensor& grad_output, const std::optional<at::Tensor>& grad_new_residual,
    const at::Tensor& new_residual, const std::optional<at::Tensor>& weight,
    const at::Tensor& rstd) {
  constexpr const char* name = "fuseops::fused_add_rms_norm_backward";
  check_floating_input(name, "grad_output", grad_output);
  check_floating_input(name, "new_residual", new_residual);
  static auto op = find_op<decltype(fused_add_rms_norm_backward)>(name);
  return op.call(grad_output, none_if_undefined(grad_new_residual), new_residual,
                 none_if_undefined(weight), rstd);
}

void fused_add_rms_norm_backward_out(const at::Tensor& grad_output,
                                     const std::optional<at::Tensor>& grad_new_residual,
                                     const at::Tensor& new_residual,
                                     const std::optional<at::Tensor>& weight,
                                     const at::Tensor& rstd, at::Tensor& grad_input,
                                     at::Tensor& grad_weight) {
  constexpr const char* name = "fuseops::fused_add_rms_norm_backward.out";
  check_floating_input(name, "grad_output", grad_output);
  check_floating_input(name, "new_residual", new_residual);
  static auto op = find_op<decltype(fused_add_rms_norm_backward_out)>(
      "fuseops::fused_add_rms_norm_backward", "out");
  op.call(grad_output, none_if_undefined(grad_new_residual), new_residual,
          none_if_undefined(weight), rstd, grad_input, grad_weight);
}

// Autocast as torch's rms_norm: CPU falls through (a reduced input with float32
// weight is computed in float32 and returned in the input's dtype); CUDA
// computes in float32. fused_add_rms_norm as torch's residual add then
// rms_norm: the add promotes on CPU.
FUSEOPS_AUTOCAST(rms_norm, kNone, kFloat32)
FUSEOPS_AUTOCAST(fused_add_rms_norm, kPromote, kFloat32)

}  // namespace fuseops
