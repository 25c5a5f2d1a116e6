// fuseops::cross_entropy and fuseops::linear_cross_entropy: the C++ API, the
// shared checks and the `*_with` entry points that every backend's kernels go
// through. The schemas and the Meta, CPU and CUDA registrations are generated
// from cpp/ops/cross_entropy.yaml. CPU kernels:
// cpp/ops/cpu/cross_entropy_kernel.cpp; CUDA: cuda/cross_entropy_kernel.cu;
// autograd: cpp/ops/autograd/cross_entropy.cpp.

#include "ops/cross_entropy.h"

#include <algorithm>
#include <cmath>

#include <ATen/MemoryOverlap.h>
#include <ATen/TensorOperators.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tanh.h>
#include <torch/library.h>

#include <fuseops/cross_entropy.h>

#include "ops/common/autocast.h"
#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/linear_loss.h"
#include "ops/common/tensors.h"

namespace fuseops {
namespace detail {

Reduction parse_reduction(const char* op, std::string_view reduction) {
  if (reduction == "mean") {
    return Reduction::Mean;
  }
  if (reduction == "sum") {
    return Reduction::Sum;
  }
  if (reduction == "none") {
    return Reduction::None;
  }
  TORCH_CHECK(false, op, ": argument 'reduction' must be 'none', 'sum' or 'mean', got '", reduction,
              "'");
}

namespace {

at::ScalarType opmath_of(const at::Tensor& t) { return at::toOpMathType(t.scalar_type()); }

void check_target(const char* op, const at::Tensor& target, const at::Tensor& logits) {
  check_defined(op, "target", target);
  TORCH_CHECK(target.scalar_type() == at::kLong || target.scalar_type() == at::kInt, op,
              ": argument 'target' must hold class indices of dtype int64 or int32, got ",
              target.scalar_type());
  check_same_device(op, "target", target, "logits", logits);
  TORCH_CHECK(target.sizes() == logits.sizes().slice(0, logits.dim() - 1), op,
              ": argument 'target' must have shape ", logits.sizes().slice(0, logits.dim() - 1),
              " (the shape of 'logits' without its last, class dimension), got ", target.sizes());
}

// `logits` (named `logits_name`) holds the classes in its `class_dim`.
void check_options(const char* op, int64_t vocab, const char* logits_name, const at::Tensor& logits,
                   const char* class_dim, const at::Tensor& weight, double label_smoothing,
                   double z_loss, std::optional<double> softcap) {
  TORCH_CHECK(vocab >= 1, op, ": argument '", logits_name, "' must have at least one class in its ",
              class_dim, " dimension, got ", logits.sizes());
  if (weight.defined()) {
    check_floating_input(op, "weight", weight);
    check_same_device(op, "weight", weight, "logits", logits);
    TORCH_CHECK(weight.dim() == 1 && weight.size(0) == vocab, op,
                ": argument 'weight' must have shape [", vocab, "] (one weight per class), got ",
                weight.sizes());
  }
  TORCH_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op,
              ": argument 'label_smoothing' must be in [0, 1], got ", label_smoothing);
  // Finite in float32, the kernels' math for all but float64 logits: a larger
  // value would become inf there (NaN for a softcap, inf * 0 for z_loss).
  TORCH_CHECK(std::isfinite(static_cast<float>(z_loss)) && z_loss >= 0.0, op,
              ": argument 'z_loss' must be a number >= 0 and finite in float32, got ", z_loss);
  TORCH_CHECK(
      !softcap.has_value() || (std::isfinite(static_cast<float>(*softcap)) && *softcap > 0.0), op,
      ": argument 'softcap' must be None or a number > 0 and finite in float32, got ",
      softcap.value_or(0.0));
}

void check_logits(const char* op, const at::Tensor& logits) {
  check_floating_input(op, "logits", logits);
  TORCH_CHECK(logits.dim() >= 1, op,
              ": argument 'logits' must have at least 1 dimension (the classes), got a "
              "0-dimensional tensor");
}

// The inputs as the kernels take them: [N, V] logits rows, int64 targets,
// weights in the computation dtype, and the row weights of the targets
// (which checks them).
struct Prepared {
  at::Tensor logits;  // [N, V] contiguous
  at::Tensor target;  // [N] int64 contiguous
  at::Tensor weight;  // [V] opmath or undefined
  at::Tensor weight_sum;
  at::Tensor row_weight;  // [N] opmath
  CrossEntropyOptions options;
};

Prepared prepare(const char* op, const at::Tensor& logits, const at::Tensor& target,
                 const at::Tensor& weight, int64_t ignore_index, double label_smoothing,
                 double z_loss, std::optional<double> softcap,
                 CrossEntropyTargetKernel target_kernel) {
  const int64_t vocab = logits.size(-1);
  const at::ScalarType opmath = opmath_of(logits);
  Prepared p;
  p.logits = logits.reshape({-1, vocab}).contiguous();
  p.target = target.reshape({-1}).to(at::kLong).contiguous();
  if (weight.defined()) {
    p.weight = weight.to(opmath).contiguous();
    p.weight_sum = p.weight.sum();
  }
  p.options = {ignore_index, label_smoothing, z_loss, softcap.value_or(0.0)};
  p.row_weight = empty_output({p.target.numel()}, logits.options().dtype(opmath));
  if (p.target.numel() > 0) {
    target_kernel({p.row_weight, p.target, p.weight, vocab, ignore_index, op});
  }
  return p;
}

at::Tensor empty_loss(const at::Tensor& logits, const at::Tensor& target, Reduction reduction) {
  return reduction == Reduction::None ? empty_output(target.sizes(), logits.options())
                                      : empty_output({}, logits.options());
}

// The loss from the per-row losses: mean divides by the summed row weights
// (0/0 = NaN when every target is ignored, as in torch).
at::Tensor reduce_loss(const at::Tensor& loss_rows, const at::Tensor& total_weight,
                       const at::Tensor& target, Reduction reduction, at::ScalarType dtype) {
  switch (reduction) {
    case Reduction::None:
      return loss_rows.to(dtype).view(target.sizes());
    case Reduction::Sum:
      return loss_rows.sum().to(dtype);
    case Reduction::Mean:
      break;
  }
  return (loss_rows.sum() / total_weight).to(dtype);
}

// The checks of the ops taking (logits, target, weight, reduction,
// options): the reduction parsed and the weight (undefined when absent).
std::pair<Reduction, at::Tensor> check_logits_call(const char* op, const at::Tensor& logits,
                                                   const at::Tensor& target,
                                                   const std::optional<at::Tensor>& weight_opt,
                                                   std::string_view reduction_name,
                                                   double label_smoothing, double z_loss,
                                                   std::optional<double> softcap) {
  const Reduction reduction = parse_reduction(op, reduction_name);
  check_logits(op, logits);
  check_target(op, target, logits);
  at::Tensor weight = undefined_if_none(weight_opt);
  check_options(op, logits.size(-1), "logits", logits, "last", weight, label_smoothing, z_loss,
                softcap);
  return {reduction, weight};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy_forward_with(
    const char* op, const at::Tensor& logits, const at::Tensor& target,
    const std::optional<at::Tensor>& weight_opt, std::string_view reduction_name,
    int64_t ignore_index, double label_smoothing, double z_loss, std::optional<double> softcap,
    CrossEntropyTargetKernel target_kernel, CrossEntropyRowsKernel rows_kernel) {
  const auto [reduction, weight] = check_logits_call(op, logits, target, weight_opt, reduction_name,
                                                     label_smoothing, z_loss, softcap);
  const auto opmath_options = logits.options().dtype(opmath_of(logits));
  at::Tensor lse = empty_output(target.sizes(), opmath_options);
  if (rows_kernel == nullptr) {
    return {empty_loss(logits, target, reduction), lse, empty_output({}, opmath_options)};
  }
  const Prepared p = prepare(op, logits, target, weight, ignore_index, label_smoothing, z_loss,
                             softcap, target_kernel);
  const at::Tensor total_weight = p.row_weight.sum();
  at::Tensor loss_rows = empty_output({p.target.numel()}, opmath_options);
  if (p.target.numel() > 0) {
    rows_kernel({loss_rows, lse.view({-1}), at::Tensor(), at::Tensor(), p.logits, p.target,
                 p.row_weight, p.weight, p.weight_sum, p.options});
  }
  return {reduce_loss(loss_rows, total_weight, target, reduction, logits.scalar_type()), lse,
          total_weight};
}

at::Tensor cross_entropy_backward_with(
    const at::Tensor& grad_output, const at::Tensor& logits, const at::Tensor& target,
    const std::optional<at::Tensor>& weight_opt, const at::Tensor& lse,
    const at::Tensor& total_weight, std::string_view reduction_name, int64_t ignore_index,
    double label_smoothing, double z_loss, std::optional<double> softcap,
    CrossEntropyTargetKernel target_kernel, CrossEntropyRowsKernel rows_kernel) {
  constexpr const char* op = "fuseops::cross_entropy_backward";
  const auto [reduction, weight] = check_logits_call(op, logits, target, weight_opt, reduction_name,
                                                     label_smoothing, z_loss, softcap);
  check_floating_input(op, "grad_output", grad_output);
  check_same_device(op, "grad_output", grad_output, "logits", logits);
  const at::IntArrayRef loss_shape =
      reduction == Reduction::None ? target.sizes() : at::IntArrayRef();
  TORCH_CHECK(grad_output.sizes() == loss_shape, op,
              ": argument 'grad_output' must have the loss's shape ", loss_shape, ", got ",
              grad_output.sizes());
  const at::ScalarType opmath = opmath_of(logits);
  for (const auto& [name, t, shape] :
       {std::tuple<const char*, const at::Tensor&, at::IntArrayRef>{"lse", lse, target.sizes()},
        {"total_weight", total_weight, at::IntArrayRef()}}) {
    check_defined(op, name, t);
    TORCH_CHECK(t.scalar_type() == opmath, op, ": argument '", name, "' must have dtype ", opmath,
                " (the computation dtype of 'logits'), got ", t.scalar_type());
    check_same_device(op, name, t, "logits", logits);
    TORCH_CHECK(t.sizes() == shape, op, ": argument '", name, "' must have shape ", shape, ", got ",
                t.sizes());
  }
  at::Tensor grad_logits = empty_contiguous_like(logits);
  if (rows_kernel == nullptr || logits.numel() == 0) {
    return grad_logits;
  }
  const Prepared p = prepare(op, logits, target, weight, ignore_index, label_smoothing, z_loss,
                             softcap, target_kernel);
  at::Tensor grad_scale = grad_output.to(opmath);
  if (reduction == Reduction::None) {
    grad_scale = grad_scale.reshape({-1}).contiguous();
  } else if (reduction == Reduction::Mean) {
    grad_scale = grad_scale / total_weight;
  }
  rows_kernel({at::Tensor(), lse.reshape({-1}).contiguous(), grad_logits.view(p.logits.sizes()),
               grad_scale, p.logits, p.target, p.row_weight, p.weight, p.weight_sum, p.options});
  return grad_logits;
}

at::Tensor cross_entropy_inplace_with(at::Tensor& logits, const at::Tensor& target,
                                      const std::optional<at::Tensor>& weight_opt,
                                      std::string_view reduction_name, int64_t ignore_index,
                                      double label_smoothing, double z_loss,
                                      std::optional<double> softcap,
                                      CrossEntropyTargetKernel target_kernel,
                                      CrossEntropyRowsKernel rows_kernel) {
  constexpr const char* op = "fuseops::cross_entropy_inplace";
  const auto [reduction, weight] = check_logits_call(op, logits, target, weight_opt, reduction_name,
                                                     label_smoothing, z_loss, softcap);
  TORCH_CHECK(at::has_internal_overlap(logits) != at::MemOverlap::Yes, op,
              ": argument 'logits' must not have elements that overlap each other (it "
              "receives the gradient), got strides ",
              logits.strides());
  if (rows_kernel == nullptr) {
    return empty_loss(logits, target, reduction);
  }
  const auto opmath_options = logits.options().dtype(opmath_of(logits));
  const Prepared p = prepare(op, logits, target, weight, ignore_index, label_smoothing, z_loss,
                             softcap, target_kernel);
  const at::Tensor total_weight = p.row_weight.sum();
  at::Tensor loss_rows = empty_output({p.target.numel()}, opmath_options);
  if (p.target.numel() > 0) {
    // The gradient of sum(loss) or mean(loss); the backward multiplies by
    // grad_output.
    const at::Tensor grad_scale = reduction == Reduction::Mean
                                      ? at::ones({}, opmath_options) / total_weight
                                      : at::ones({}, opmath_options);
    // p.logits is `logits` itself when that is contiguous (written in
    // place), else a copy whose gradient is copied back.
    rows_kernel({loss_rows, empty_output({p.target.numel()}, opmath_options), p.logits, grad_scale,
                 p.logits, p.target, p.row_weight, p.weight, p.weight_sum, p.options});
    if (p.logits.data_ptr() != logits.data_ptr()) {
      logits.copy_(p.logits.view(logits.sizes()));
    }
  }
  return reduce_loss(loss_rows, total_weight, target, reduction, logits.scalar_type());
}

namespace {

// The softmax statistics of a chunk's logits [n, V] into out [n, 3]
// (opmath): entropy, mean logit and log(sum p^2) of z = softcap(logits),
// 0 where `valid` is false. ATen operations on any device, in blocks of rows
// whose float32 temporaries stay about 16 MiB each: one more read of the
// chunk, against the H multiply-adds per logit of its GEMM.
void softmax_stats_of(const at::Tensor& out, const at::Tensor& logits, const at::Tensor& valid,
                      double softcap, at::ScalarType opmath) {
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  const int64_t block = std::max<int64_t>(1, (int64_t{4} << 20) / std::max<int64_t>(vocab, 1));
  for (int64_t start = 0; start < rows; start += block) {
    const int64_t n = std::min(block, rows - start);
    at::Tensor z = logits.narrow(0, start, n).to(opmath);
    if (softcap > 0) {
      z = at::tanh(z / softcap) * softcap;
    }
    const at::Tensor lse = at::logsumexp(z, {1}, /*keepdim=*/true);
    const at::Tensor shifted = z - lse;  // log p
    const at::Tensor entropy = -(at::exp(shifted) * shifted).sum(1);
    const at::Tensor mean_logit = z.mean(1);
    const at::Tensor log_sum_sq = at::logsumexp(shifted * 2, {1});
    const at::Tensor keep = valid.narrow(0, start, n);
    at::Tensor rows_out = out.narrow(0, start, n);
    rows_out.select(1, 0).copy_(entropy.where(keep, 0));
    rows_out.select(1, 1).copy_(mean_logit.where(keep, 0));
    rows_out.select(1, 2).copy_(log_sum_sq.where(keep, 0));
  }
}

}  // namespace

LinearCrossEntropyResult linear_cross_entropy_with(
    const char* op, const at::Tensor& input, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias_opt, const at::Tensor& target,
    const std::optional<at::Tensor>& class_weight_opt, std::string_view reduction_name,
    int64_t ignore_index, double label_smoothing, double z_loss, std::optional<double> softcap,
    std::optional<double> normalizer, LinearLossGradient gradient, const at::Tensor& grad_output,
    bool predict, bool softmax_stats, CrossEntropyTargetKernel target_kernel,
    CrossEntropyRowsKernel rows_kernel) {
  const Reduction reduction = parse_reduction(op, reduction_name);
  check_floating_input(op, "input", input);
  TORCH_CHECK(input.dim() == 2, op, ": argument 'input' must have shape [N, H], got ",
              input.sizes());
  check_floating_input(op, "weight", weight);
  check_same_dtype(op, "weight", weight, "input", input);
  check_same_device(op, "weight", weight, "input", input);
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == input.size(1), op,
              ": argument 'weight' must have shape [V, ", input.size(1),
              "] (H, the last dimension of 'input'), got ", weight.sizes());
  const int64_t rows = input.size(0);
  const int64_t hidden = input.size(1);
  const int64_t vocab = weight.size(0);
  const at::Tensor bias = undefined_if_none(bias_opt);
  if (bias.defined()) {
    check_floating_input(op, "bias", bias);
    check_same_dtype(op, "bias", bias, "input", input);
    check_same_device(op, "bias", bias, "input", input);
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == vocab, op, ": argument 'bias' must have shape [",
                vocab, "] (the first dimension of 'weight'), got ", bias.sizes());
  }
  check_defined(op, "target", target);
  TORCH_CHECK(target.scalar_type() == at::kLong || target.scalar_type() == at::kInt, op,
              ": argument 'target' must hold class indices of dtype int64 or int32, got ",
              target.scalar_type());
  check_same_device(op, "target", target, "input", input);
  TORCH_CHECK(target.dim() == 1 && target.size(0) == rows, op,
              ": argument 'target' must have shape [", rows,
              "] (the first dimension of 'input'), got ", target.sizes());
  const at::Tensor class_weight = undefined_if_none(class_weight_opt);
  if (class_weight.defined()) {
    check_floating_input(op, "class_weight", class_weight);
    check_same_device(op, "class_weight", class_weight, "input", input);
    TORCH_CHECK(class_weight.dim() == 1 && class_weight.size(0) == vocab, op,
                ": argument 'class_weight' must have shape [", vocab,
                "] (one weight per class), got ", class_weight.sizes());
  }
  check_options(op, vocab, "weight", weight, "first", at::Tensor(), label_smoothing, z_loss,
                softcap);
  TORCH_CHECK(!normalizer.has_value() || reduction == Reduction::Sum, op,
              ": argument 'normalizer' is only used with reduction='sum', got reduction='",
              reduction_name, "'");
  TORCH_CHECK(!normalizer.has_value() || (std::isfinite(*normalizer) && *normalizer != 0.0), op,
              ": argument 'normalizer' must be a finite nonzero number, got ",
              normalizer.value_or(0.0));

  const bool with_grad = gradient != LinearLossGradient::None;
  if (gradient == LinearLossGradient::OfGradOutput) {
    check_floating_input(op, "grad_output", grad_output);
    check_same_device(op, "grad_output", grad_output, "input", input);
    const at::IntArrayRef loss_shape =
        reduction == Reduction::None ? target.sizes() : at::IntArrayRef();
    TORCH_CHECK(grad_output.sizes() == loss_shape, op,
                ": argument 'grad_output' must have the loss's shape ", loss_shape, ", got ",
                grad_output.sizes());
  }

  const at::ScalarType opmath = opmath_of(input);
  const auto opmath_options = input.options().dtype(opmath);
  LinearCrossEntropyResult r;
  r.loss = reduction == Reduction::None ? empty_output({rows}, input.options())
                                        : empty_output({}, input.options());
  r.lse = empty_output({rows}, opmath_options);
  r.predicted = empty_output({predict ? rows : 0}, input.options().dtype(at::kLong));
  r.softmax_stats = empty_output({softmax_stats ? rows : 0, 3}, opmath_options);
  r.grad_input = with_grad ? empty_output({rows, hidden}, input.options())
                           : empty_output({0}, input.options());
  const bool head_grad = with_grad && gradient != LinearLossGradient::InputOfOne;
  r.grad_weight = head_grad ? empty_output({vocab, hidden}, input.options())
                            : empty_output({0}, input.options());
  r.grad_bias = head_grad && bias.defined() ? empty_output({vocab}, input.options())
                                            : empty_output({0}, input.options());
  if (rows_kernel == nullptr) {
    return r;
  }

  const at::Tensor x = input.contiguous();
  const at::Tensor w = weight.contiguous();
  // Row checks and weights of every target first: the mean's divisor scales
  // every chunk's gradient. (prepare() reads the class count, dtype and
  // device from its logits argument: an empty [0, V] stands for them.)
  const at::Tensor no_logits = empty_output({0, vocab}, input.options());
  const Prepared p = prepare(op, no_logits, target, class_weight, ignore_index, label_smoothing,
                             z_loss, softcap, target_kernel);
  const at::Tensor total_weight = p.row_weight.sum();
  // The gradient's scale: 0-d for every row alike, or [N] per row (the
  // backward of reduction "none").
  at::Tensor scale = gradient == LinearLossGradient::OfGradOutput
                         ? grad_output.to(opmath).reshape({-1}).contiguous()
                         : at::ones({}, opmath_options);
  if (gradient == LinearLossGradient::OfGradOutput && reduction != Reduction::None) {
    scale = scale.reshape(at::IntArrayRef());
  }
  if (reduction == Reduction::Mean) {
    scale = scale / total_weight;
  } else if (normalizer.has_value()) {
    scale = scale / *normalizer;
  }

  const int64_t chunk = linear_loss_chunk_rows(rows, hidden, vocab);
  at::Tensor buffer = empty_output({std::max<int64_t>(chunk, 0), vocab}, input.options());
  at::Tensor loss_rows = empty_output({rows}, opmath_options);
  LinearLossHead head(w, bias, head_grad ? r.grad_weight : at::Tensor(),
                      head_grad && bias.defined() ? r.grad_bias : at::Tensor());
  for (int64_t start = 0; start < rows; start += chunk) {
    const int64_t n = std::min(chunk, rows - start);
    const at::Tensor x_chunk = x.narrow(0, start, n);
    at::Tensor logits = buffer.narrow(0, 0, n);
    head.logits(logits, x_chunk);
    if (predict) {
      // Before the gradient overwrites the logits; one more read of the
      // chunk, against the H multiply-adds per logit of its GEMM.
      at::Tensor predicted_rows = r.predicted.narrow(0, start, n);
      at::argmax_out(predicted_rows, logits, 1);
    }
    if (softmax_stats) {
      softmax_stats_of(r.softmax_stats.narrow(0, start, n), logits,
                       target.narrow(0, start, n) != ignore_index, softcap.value_or(0.0), opmath);
    }
    // The gradient overwrites the chunk's logits.
    rows_kernel({loss_rows.narrow(0, start, n), r.lse.narrow(0, start, n),
                 with_grad ? logits : at::Tensor(),
                 scale.dim() == 0 ? scale : scale.narrow(0, start, n), logits,
                 p.target.narrow(0, start, n), p.row_weight.narrow(0, start, n), p.weight,
                 p.weight_sum, p.options});
    if (!with_grad) {
      continue;
    }
    head.backward(logits, x_chunk, r.grad_input.narrow(0, start, n));
  }
  head.finish();
  switch (reduction) {
    case Reduction::None:
      r.loss.copy_(loss_rows);
      break;
    case Reduction::Sum:
      r.loss.copy_(normalizer.has_value() ? loss_rows.sum() / *normalizer : loss_rows.sum());
      break;
    case Reduction::Mean:
      r.loss.copy_(loss_rows.sum() / total_weight);
      break;
  }
  return r;
}

}  // namespace detail

// C++ API: through the dispatcher, so autograd and the device kernels apply.
// Undefined tensors carry no dispatch key, so they are rejected here, before
// the dispatcher would fail with a message that names no argument.
using detail::find_op;
using detail::none_if_undefined;

namespace {

// The entry points taking (logits, target, weight, ...): their checks, then
// the call; the arguments after `weight` pass through.
template <typename Op, typename Logits, typename... Rest>
auto call_with_logits(const Op& op, Logits& logits, const at::Tensor& target,
                      const std::optional<at::Tensor>& weight, const Rest&... rest) {
  check_floating_input(op.operator_name().name.c_str(), "logits", logits);
  return op.call(logits, target, none_if_undefined(weight), rest...);
}

// The same for (input, weight, bias, target, class_weight, ...).
template <typename Op, typename... Rest>
auto call_with_input(const Op& op, const at::Tensor& input, const at::Tensor& weight,
                     const std::optional<at::Tensor>& bias, const at::Tensor& target,
                     const std::optional<at::Tensor>& class_weight, const Rest&... rest) {
  const char* name = op.operator_name().name.c_str();
  check_floating_input(name, "input", input);
  check_floating_input(name, "weight", weight);
  return op.call(input, weight, none_if_undefined(bias), target, none_if_undefined(class_weight),
                 rest...);
}

}  // namespace

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                         const std::optional<at::Tensor>& weight, std::string_view reduction,
                         int64_t ignore_index, double label_smoothing, double z_loss,
                         std::optional<double> softcap) {
  static auto op = find_op<decltype(cross_entropy)>("fuseops::cross_entropy");
  return call_with_logits(op, logits, target, weight, reduction, ignore_index, label_smoothing,
                          z_loss, softcap);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy_forward(
    const at::Tensor& logits, const at::Tensor& target, const std::optional<at::Tensor>& weight,
    std::string_view reduction, int64_t ignore_index, double label_smoothing, double z_loss,
    std::optional<double> softcap) {
  static auto op = find_op<decltype(cross_entropy_forward)>("fuseops::cross_entropy_forward");
  return call_with_logits(op, logits, target, weight, reduction, ignore_index, label_smoothing,
                          z_loss, softcap);
}

at::Tensor cross_entropy_backward(const at::Tensor& grad_output, const at::Tensor& logits,
                                  const at::Tensor& target, const std::optional<at::Tensor>& weight,
                                  const at::Tensor& lse, const at::Tensor& total_weight,
                                  std::string_view reduction, int64_t ignore_index,
                                  double label_smoothing, double z_loss,
                                  std::optional<double> softcap) {
  constexpr const char* name = "fuseops::cross_entropy_backward";
  check_floating_input(name, "grad_output", grad_output);
  check_floating_input(name, "logits", logits);
  static auto op = find_op<decltype(cross_entropy_backward)>(name);
  return op.call(grad_output, logits, target, none_if_undefined(weight), lse, total_weight,
                 reduction, ignore_index, label_smoothing, z_loss, softcap);
}

at::Tensor cross_entropy_inplace(at::Tensor& logits, const at::Tensor& target,
                                 const std::optional<at::Tensor>& weight,
                                 std::string_view reduction, int64_t ignore_index,
                                 double label_smoothing, double z_loss,
                                 std::optional<double> softcap) {
  static auto op = find_op<decltype(cross_entropy_inplace)>("fuseops::cross_entropy_inplace");
  return call_with_logits(op, logits, target, weight, reduction, ignore_index, label_smoothing,
                          z_loss, softcap);
}

at::Tensor linear_cross_entropy(const at::Tensor& input, const at::Tensor& weight,
                                const std::optional<at::Tensor>& bias, const at::Tensor& target,
                                const std::optional<at::Tensor>& class_weight,
                                std::string_view reduction, int64_t ignore_index,
                                double label_smoothing, double z_loss,
                                std::optional<double> softcap, std::optional<double> normalizer) {
  static auto op = find_op<decltype(linear_cross_entropy)>("fuseops::linear_cross_entropy");
  return call_with_input(op, input, weight, bias, target, class_weight, reduction, ignore_index,
                         label_smoothing, z_loss, softcap, normalizer);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_stats(
    const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const at::Tensor& target, const std::optional<at::Tensor>& class_weight,
    std::string_view reduction, int64_t ignore_index, double label_smoothing, double z_loss,
    std::optional<double> softcap, std::optional<double> normalizer, bool predict,
    bool softmax_stats) {
  static auto op =
      find_op<decltype(linear_cross_entropy_stats)>("fuseops::linear_cross_entropy_stats");
  return call_with_input(op, input, weight, bias, target, class_weight, reduction, ignore_index,
                         label_smoothing, z_loss, softcap, normalizer, predict, softmax_stats);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
linear_cross_entropy_forward(const at::Tensor& input, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias, const at::Tensor& target,
                             const std::optional<at::Tensor>& class_weight,
                             std::string_view reduction, int64_t ignore_index,
                             double label_smoothing, double z_loss, std::optional<double> softcap,
                             std::optional<double> normalizer, bool predict, bool weight_grad,
                             bool softmax_stats) {
  static auto op =
      find_op<decltype(linear_cross_entropy_forward)>("fuseops::linear_cross_entropy_forward");
  return call_with_input(op, input, weight, bias, target, class_weight, reduction, ignore_index,
                         label_smoothing, z_loss, softcap, normalizer, predict, weight_grad,
                         softmax_stats);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, const at::Tensor& target,
    const std::optional<at::Tensor>& class_weight, std::string_view reduction, int64_t ignore_index,
    double label_smoothing, double z_loss, std::optional<double> softcap,
    std::optional<double> normalizer) {
  constexpr const char* name = "fuseops::linear_cross_entropy_backward";
  check_floating_input(name, "grad_output", grad_output);
  check_floating_input(name, "input", input);
  check_floating_input(name, "weight", weight);
  static auto op = find_op<decltype(linear_cross_entropy_backward)>(name);
  return op.call(grad_output, input, weight, none_if_undefined(bias), target,
                 none_if_undefined(class_weight), reduction, ignore_index, label_smoothing, z_loss,
                 softcap, normalizer);
}

// Autocast as torch's cross_entropy: float32 logits (and a float32 loss) on
// CPU and CUDA. linear_cross_entropy as the composition it replaces,
// cross_entropy(linear(input, weight, bias), ...): the GEMMs in the autocast
// dtype (a float32 LM head under bfloat16 autocast, as Trainer(bf16=True)
// has it) and a float32 loss. The loss is computed in float32 (the row
// statistics are) but leaves the op in the GEMM dtype, then is widened: it
// carries that dtype's rounding (2^-9 relative for bfloat16).
FUSEOPS_AUTOCAST(cross_entropy, kFloat32, kFloat32)
FUSEOPS_AUTOCAST(linear_cross_entropy, kLinearLoss, kLinearLoss)
FUSEOPS_AUTOCAST(linear_cross_entropy_stats, kLinearLoss, kLinearLoss)

}  // namespace fuseops
