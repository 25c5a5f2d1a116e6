// fuseops::layer_norm: the C++ API, the shared checks and the `*_with` entry
// points that every backend's kernels go through. The schemas and the Meta, CPU
// and CUDA registrations are generated from cpp/ops/layer_norm.yaml. CPU
// kernels: cpp/ops/cpu/layer_norm_kernel.cpp; CUDA: cuda/layer_norm_kernel.cu;
// autograd: cpp/ops/autograd/layer_norm.cpp.

#include "ops/layer_norm.h"

#include <limits>

#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <fuseops/layer_norm.h>

#include "ops/common/autocast.h"
#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/tensors.h"

namespace fuseops {
namespace detail {
namespace {

// Per-row statistics are kept in the kernels' accumulation type.
at::ScalarType stats_dtype(const at::Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// mean and rstd have input's shape without its last dimension.
at::IntArrayRef stats_shape(const at::Tensor& input) {
  return input.sizes().slice(0, input.dim() - 1);
}

void check_input(const char* op, const at::Tensor& input) {
  check_floating_input(op, "input", input);
  TORCH_CHECK(input.dim() >= 1, op,
              ": argument 'input' must have at least one dimension (the one "
              "normalized), got a 0-dimensional tensor");
}

// weight and bias: absent, or [H] with input's dtype and device.
void check_affine(const char* op, const char* arg, const at::Tensor& param,
                  const at::Tensor& input) {
  if (!param.defined()) {
    return;
  }
  check_floating_input(op, arg, param);
  check_same_dtype(op, arg, param, "input", input);
  check_same_device(op, arg, param, "input", input);
  TORCH_CHECK(param.dim() == 1 && param.size(0) == input.size(-1), op, ": argument '", arg,
              "' must have shape [", input.size(-1), "] (the last dimension of 'input'), got ",
              param.sizes());
}

// mean and rstd as layer_norm_forward returns them, or as
// at::native_layer_norm does: with a trailing dimension of 1 and, on CPU,
// input's dtype.
void check_stats(const char* op, const char* arg, const at::Tensor& stats,
                 const at::Tensor& input) {
  check_floating_input(op, arg, stats);
  check_same_device(op, arg, stats, "input", input);
  const bool keepdim = stats.dim() == input.dim() && stats.size(-1) == 1 &&
                       stats.sizes().slice(0, stats.dim() - 1) == stats_shape(input);
  TORCH_CHECK(stats.sizes() == stats_shape(input) || keepdim, op, ": argument '", arg,
              "' must have shape ", stats_shape(input),
              " (input's shape without its last dimension) or that shape followed by 1 "
              "(as at::native_layer_norm returns it), got ",
              stats.sizes());
}

at::Tensor kernel_stats(const at::Tensor& stats, const at::Tensor& input) {
  return stats.reshape(stats_shape(input)).to(stats_dtype(input)).contiguous();
}

void check_forward_args(const char* op, const at::Tensor& input, const at::Tensor& weight,
                        const at::Tensor& bias) {
  check_input(op, input);
  check_affine(op, "weight", weight, input);
  check_affine(op, "bias", bias, input);
}

// Runs `kernel` unless there is nothing to compute; `mean` and `rstd` may be
// undefined.
void run_forward(LayerNormKernel kernel, const at::Tensor& out, const at::Tensor& mean,
                 const at::Tensor& rstd, const at::Tensor& input, const at::Tensor& weight,
                 const at::Tensor& bias, double eps) {
  if (kernel == nullptr) {
    return;
  }
  if (input.numel() == 0) {
    // Rows of zero elements have no mean or variance (as torch.mean of an
    // empty tensor).
    if (mean.defined()) {
      mean.fill_(std::numeric_limits<double>::quiet_NaN());
      rstd.fill_(std::numeric_limits<double>::quiet_NaN());
    }
    return;
  }
  kernel(out, mean, rstd, input.contiguous(), contiguous_if_defined(weight),
         contiguous_if_defined(bias), eps);
}

}  // namespace

at::Tensor layer_norm_with(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, double eps,
                           LayerNormKernel kernel) {
  const at::Tensor w = undefined_if_none(weight);
  const at::Tensor b = undefined_if_none(bias);
  check_forward_args("fuseops::layer_norm", input, w, b);
  at::Tensor out = empty_contiguous_like(input);
  run_forward(kernel, out, at::Tensor(), at::Tensor(), input, w, b, eps);
  return out;
}

at::Tensor& layer_norm_out_with(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                const std::optional<at::Tensor>& bias, double eps, at::Tensor& out,
                                LayerNormKernel kernel) {
  constexpr const char* op = "fuseops::layer_norm.out";
  const at::Tensor w = undefined_if_none(weight);
  const at::Tensor b = undefined_if_none(bias);
  check_forward_args(op, input, w, b);
  check_out(op, out, "input", input);
  prepare_outputs(op, {{"out", out}}, input.sizes(),
                  {{"input", input}, {"weight", w}, {"bias", b}});
  if (kernel == nullptr || input.numel() == 0) {
    return out;
  }
  // Each row is read completely before it is written, so `out` may be
  // `input` itself.
  const at::Tensor contiguous_input = input.contiguous();
  fill_out(out, {contiguous_input}, {w, b}, [&](const at::Tensor& target) {
    run_forward(kernel, target, at::Tensor(), at::Tensor(), contiguous_input, w, b, eps);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_forward_with(
    const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps, LayerNormKernel kernel) {
  const at::Tensor w = undefined_if_none(weight);
  const at::Tensor b = undefined_if_none(bias);
  check_forward_args("fuseops::layer_norm_forward", input, w, b);
  at::Tensor out = empty_contiguous_like(input);
  const auto stats_options = input.options().dtype(stats_dtype(input));
  at::Tensor mean = detail::empty_output(stats_shape(input), stats_options);
  at::Tensor rstd = detail::empty_output(stats_shape(input), stats_options);
  run_forward(kernel, out, mean, rstd, input, w, b, eps);
  return {out, mean, rstd};
}

namespace {

// The checks of a backward call; returns the weight (undefined for none).
at::Tensor check_backward(const char* op, const at::Tensor& grad_output, const at::Tensor& input,
                          const std::optional<at::Tensor>& weight, const at::Tensor& mean,
                          const at::Tensor& rstd) {
  const at::Tensor w = undefined_if_none(weight);
  check_input(op, input);
  check_floating_input(op, "grad_output", grad_output);
  check_same_dtype(op, "grad_output", grad_output, "input", input);
  check_same_device(op, "grad_output", grad_output, "input", input);
  check_same_shape(op, "grad_output", grad_output, "input", input);
  check_affine(op, "weight", w, input);
  check_stats(op, "mean", mean, input);
  check_stats(op, "rstd", rstd, input);
  return w;
}

// Fills the three gradients (contiguous, allocated); grad_input may be
// exactly grad_output or input (the kernels read a row's element before
// writing it).
void run_backward(LayerNormBackwardKernel kernel, const at::Tensor& grad_input,
                  const at::Tensor& grad_weight, const at::Tensor& grad_bias,
                  const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& w,
                  const at::Tensor& mean, const at::Tensor& rstd) {
  if (kernel == nullptr) {
    return;
  }
  if (input.numel() == 0) {
    // No rows: the sums over rows are empty.
    grad_weight.zero_();
    grad_bias.zero_();
    return;
  }
  kernel(grad_input, grad_weight, grad_bias, grad_output.contiguous(), input.contiguous(),
         contiguous_if_defined(w), kernel_stats(mean, input), kernel_stats(rstd, input));
}

// The tensors both backward overloads check before calling the dispatcher.
void check_backward_inputs(const char* op, const at::Tensor& grad_output, const at::Tensor& input,
                           const at::Tensor& mean, const at::Tensor& rstd) {
  check_floating_input(op, "grad_output", grad_output);
  check_floating_input(op, "input", input);
  check_defined(op, "mean", mean);
  check_defined(op, "rstd", rstd);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_with(
    const at::Tensor& grad_output, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const at::Tensor& mean, const at::Tensor& rstd, LayerNormBackwardKernel kernel) {
  const at::Tensor w =
      check_backward("fuseops::layer_norm_backward", grad_output, input, weight, mean, rstd);
  const int64_t hidden = input.size(-1);
  at::Tensor grad_input = empty_contiguous_like(input);
  at::Tensor grad_weight = detail::empty_output({hidden}, input.options());
  at::Tensor grad_bias = detail::empty_output({hidden}, input.options());
  run_backward(kernel, grad_input, grad_weight, grad_bias, grad_output, input, w, mean, rstd);
  return {grad_input, grad_weight, grad_bias};
}

void layer_norm_backward_out_with(const at::Tensor& grad_output, const at::Tensor& input,
                                  const std::optional<at::Tensor>& weight, const at::Tensor& mean,
                                  const at::Tensor& rstd, at::Tensor& grad_input,
                                  at::Tensor& grad_weight, at::Tensor& grad_bias,
                                  LayerNormBackwardKernel kernel) {
  constexpr const char* op = "fuseops::layer_norm_backward.out";
  const at::Tensor w = check_backward(op, grad_output, input, weight, mean, rstd);
  check_out(op, grad_input, "input", input, "grad_input");
  check_out(op, grad_weight, "input", input, "grad_weight");
  check_out(op, grad_bias, "input", input, "grad_bias");
  for (const at::Tensor* row_sum : {&grad_weight, &grad_bias}) {
    TORCH_CHECK(!share_memory(grad_input, *row_sum), op, ": arguments 'grad_input' and '",
                row_sum == &grad_weight ? "grad_weight" : "grad_bias",
                "' share memory; each result needs its own tensor");
  }
  const std::initializer_list<NamedTensor> inputs = {{"grad_output", grad_output},
                                                     {"input", input},
                                                     {"weight", w},
                                                     {"mean", mean},
                                                     {"rstd", rstd}};
  prepare_outputs(op, {{"grad_input", grad_input}}, input.sizes(), inputs);
  prepare_outputs(op, {{"grad_weight", grad_weight}, {"grad_bias", grad_bias}}, {input.size(-1)},
                  inputs);
  if (kernel == nullptr) {
    return;
  }
  // Row-wise: grad_input may be exactly grad_output or input. The row sums
  // ([hidden] each) go through temporaries.
  const at::Tensor weight_target = detail::empty_output({input.size(-1)}, input.options());
  const at::Tensor bias_target = detail::empty_output({input.size(-1)}, input.options());
  fill_out(grad_input, {grad_output.contiguous(), input.contiguous()},
           {w, mean, rstd, grad_weight, grad_bias}, [&](const at::Tensor& target) {
             run_backward(kernel, target, weight_target, bias_target, grad_output, input, w, mean,
                          rstd);
           });
  grad_weight.copy_(weight_target);
  grad_bias.copy_(bias_target);
}

}  // namespace detail

// C++ API: through the dispatcher, so autograd and the device kernels apply.
// Undefined tensors carry no dispatch key, so they are rejected here, before
// the dispatcher would fail with a message that names no argument.
at::Tensor layer_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias, double eps) {
  check_floating_input("fuseops::layer_norm", "input", input);
  static auto op = detail::find_op<decltype(layer_norm)>("fuseops::layer_norm");
  return op.call(input, weight, bias, eps);
}

at::Tensor& layer_norm_out(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, double eps, at::Tensor& out) {
  check_floating_input("fuseops::layer_norm.out", "input", input);
  check_out("fuseops::layer_norm.out", out, "input", input);
  static auto op = detail::find_out_op<decltype(layer_norm_out)>("fuseops::layer_norm", "out");
  op.call(input, weight, bias, eps, out);
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_forward(
    const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps) {
  check_floating_input("fuseops::layer_norm_forward", "input", input);
  static auto op = detail::find_op<decltype(layer_norm_forward)>("fuseops::layer_norm_forward");
  return op.call(input, weight, bias, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const at::Tensor& mean, const at::Tensor& rstd) {
  constexpr const char* name = "fuseops::layer_norm_backward";
  detail::check_backward_inputs(name, grad_output, input, mean, rstd);
  static auto op = detail::find_op<decltype(layer_norm_backward)>(name);
  return op.call(grad_output, input, weight, mean, rstd);
}

void layer_norm_backward_out(const at::Tensor& grad_output, const at::Tensor& input,
                             const std::optional<at::Tensor>& weight, const at::Tensor& mean,
                             const at::Tensor& rstd, at::Tensor& grad_input,
                             at::Tensor& grad_weight, at::Tensor& grad_bias) {
  constexpr const char* name = "fuseops::layer_norm_backward.out";
  detail::check_backward_inputs(name, grad_output, input, mean, rstd);
  check_out(name, grad_input, "input", input, "grad_input");
  check_out(name, grad_weight, "input", input, "grad_weight");
  check_out(name, grad_bias, "input", input, "grad_bias");
  static auto op =
      detail::find_op<decltype(layer_norm_backward_out)>("fuseops::layer_norm_backward", "out");
  op.call(grad_output, input, weight, mean, rstd, grad_input, grad_weight, grad_bias);
}

// Autocast as torch's layer_norm: CPU returns the input's dtype (parameters
// cast to it, as fuseops takes one dtype); CUDA computes in float32.
FUSEOPS_AUTOCAST(layer_norm, kFirstInput, kFloat32)

}  // namespace fuseops
