// fuseops::jsd: the C++ API, the shared checks and the `*_with` entry points
// that every backend's kernels go through. The schemas and the Meta, CPU and
// CUDA registrations are generated from cpp/ops/jsd.yaml. CPU kernels:
// cpp/ops/cpu/jsd_kernel.cpp; CUDA: cuda/jsd_kernel.cu; autograd:
// cpp/ops/autograd/jsd.cpp.

#include "ops/jsd.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <ATen/OpMathType.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/sum.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include <fuseops/jsd.h>

#include "ops/common/autocast.h"
#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/linear_loss.h"
#include "ops/common/output_memory.h"
#include "ops/common/tensors.h"

namespace fuseops {
namespace detail {
namespace {

JsdReduction parse_jsd_reduction(const char* op, std::string_view reduction) {
  if (reduction == "batchmean") {
    return JsdReduction::BatchMean;
  }
  if (reduction == "sum") {
    return JsdReduction::Sum;
  }
  if (reduction == "mean") {
    return JsdReduction::Mean;
  }
  if (reduction == "none") {
    return JsdReduction::None;
  }
  TORCH_CHECK(false, op,
              ": argument 'reduction' must be 'batchmean', 'sum', 'mean' or 'none', got '",
              reduction, "'");
}

// `label` (undefined, or class indices of shape `shape` on the device of
// `like`, named `like_name`; `shape_origin` says where the shape comes from).
void check_label(const char* op, const at::Tensor& label, const at::Tensor& like,
                 const char* like_name, at::IntArrayRef shape, const char* shape_origin) {
  if (!label.defined()) {
    return;
  }
  TORCH_CHECK(label.scalar_type() == at::kLong || label.scalar_type() == at::kInt, op,
              ": argument 'label' must hold class indices of dtype int64 or int32, got ",
              label.scalar_type());
  check_same_device(op, "label", label, like_name, like);
  TORCH_CHECK(label.sizes() == shape, op, ": argument 'label' must have shape ", shape,
              shape_origin, ", got ", label.sizes());
}

void check_options(const char* op, double beta, double temperature) {
  TORCH_CHECK(beta >= 0.0 && beta <= 1.0, op, ": argument 'beta' must be in [0, 1], got ", beta);
  // The kernels divide by the temperature in float32 for all but float64
  // logits: it and its reciprocal must be finite there.
  TORCH_CHECK(temperature > 0.0 && std::isfinite(static_cast<float>(temperature)) &&
                  std::isfinite(static_cast<float>(1.0 / temperature)),
              op,
              ": argument 'temperature' must be a number > 0 whose value and reciprocal are "
              "finite in float32, got ",
              temperature);
}

// The checks every entry point on logits shares; returns the reduction.
JsdReduction check_inputs(const char* op, const at::Tensor& student, const at::Tensor& teacher,
                          const at::Tensor& label, double beta, double temperature,
                          std::string_view reduction_name) {
  const JsdReduction reduction = parse_jsd_reduction(op, reduction_name);
  check_floating_input(op, "student_logits", student);
  check_floating_input(op, "teacher_logits", teacher);
  TORCH_CHECK(student.dim() >= 1, op,
              ": argument 'student_logits' must have at least 1 dimension (the classes), got a "
              "0-dimensional tensor");
  check_same_dtype(op, "teacher_logits", teacher, "student_logits", student);
  check_same_device(op, "teacher_logits", teacher, "student_logits", student);
  check_same_shape(op, "teacher_logits", teacher, "student_logits", student);
  TORCH_CHECK(student.size(-1) >= 1, op,
              ": argument 'student_logits' must have at least one class in its last dimension, "
              "got ",
              student.sizes());
  check_label(op, label, student, "student_logits", student.sizes().slice(0, student.dim() - 1),
              " (the shape of 'student_logits' without its last, class dimension)");
  check_options(op, beta, temperature);
  return reduction;
}

at::IntArrayRef rows_shape(const at::Tensor& student) {
  return student.sizes().slice(0, student.dim() - 1);
}

at::Tensor empty_loss(const at::Tensor& student, JsdReduction reduction) {
  return reduction == JsdReduction::None ? empty_output(rows_shape(student), student.options())
                                         : empty_output({}, student.options());
}

// The rows as the kernels take them: [N, V] contiguous logits and [N] int64
// labels.
struct Prepared {
  at::Tensor student;
  at::Tensor teacher;
  at::Tensor label;
};

Prepared prepare(const at::Tensor& student, const at::Tensor& teacher, const at::Tensor& label) {
  const int64_t vocab = student.size(-1);
  return {student.reshape({-1, vocab}).contiguous(), teacher.reshape({-1, vocab}).contiguous(),
          label.defined() ? label.reshape({-1}).to(at::kLong).contiguous() : at::Tensor()};
}

// What "batchmean" and "mean" divide the sum of the row losses by: the
// counted rows of `rows` rows of `vocab` classes (times V for "mean"), at
// least one, as a 0-d tensor with `options` (opmath, the logits' device).
at::Tensor divisor(int64_t rows, int64_t vocab, const at::Tensor& label, int64_t ignore_index,
                   JsdReduction reduction, const at::TensorOptions& options) {
  const int64_t per_row = reduction == JsdReduction::Mean ? vocab : 1;
  if (!label.defined()) {
    return at::scalar_tensor(static_cast<double>(std::max<int64_t>(rows, 1) * per_row), options);
  }
  return at::ne(label, ignore_index).sum().clamp_min(1).to(options.dtype()) *
         static_cast<double>(per_row);
}

at::Tensor divisor(const at::Tensor& student, const at::Tensor& label, int64_t ignore_index,
                   JsdReduction reduction, at::ScalarType opmath) {
  return divisor(c10::multiply_integers(rows_shape(student)), student.size(-1), label, ignore_index,
                 reduction, student.options().dtype(opmath));
}

// The loss from the per-row losses (opmath, [N] for N rows of `vocab`),
// in `dtype`, of shape `none_shape` for reduction "none".
at::Tensor reduce_rows(const at::Tensor& loss_rows, int64_t vocab, at::IntArrayRef none_shape,
                       const at::Tensor& label, int64_t ignore_index, JsdReduction reduction,
                       at::ScalarType dtype) {
  switch (reduction) {
    case JsdReduction::None:
      return loss_rows.to(dtype).view(none_shape);
    case JsdReduction::Sum:
      return loss_rows.sum().to(dtype);
    case JsdReduction::Mean:
    case JsdReduction::BatchMean:
      break;
  }
  return (loss_rows.sum() /
          divisor(loss_rows.numel(), vocab, label, ignore_index, reduction, loss_rows.options()))
      .to(dtype);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> jsd_forward_with(
    const char* op, const at::Tensor& student, const at::Tensor& teacher,
    const std::optional<at::Tensor>& label_opt, double beta, double temperature,
    int64_t ignore_index, std::string_view reduction_name, JsdRowsKernel kernel) {
  const at::Tensor label = undefined_if_none(label_opt);
  const JsdReduction reduction =
      check_inputs(op, student, teacher, label, beta, temperature, reduction_name);
  const at::ScalarType opmath = at::toOpMathType(student.scalar_type());
  const auto opmath_options = student.options().dtype(opmath);
  const int64_t rows = c10::multiply_integers(rows_shape(student));
  at::Tensor row_stats = empty_output({rows, 3}, opmath_options);
  if (kernel == nullptr) {
    return {empty_loss(student, reduction), row_stats};
  }
  at::Tensor loss_rows = empty_output({rows}, opmath_options);
  if (rows > 0) {
    const Prepared p = prepare(student, teacher, label);
    kernel({loss_rows,
            row_stats,
            at::Tensor(),
            at::Tensor(),
            p.student,
            p.teacher,
            p.label,
            {beta, temperature, ignore_index}});
  }
  return {reduce_rows(loss_rows, student.size(-1), rows_shape(student), label, ignore_index,
                      reduction, student.scalar_type()),
          row_stats};
}

at::Tensor jsd_backward_with(const at::Tensor& grad_output, const at::Tensor& student,
                             const at::Tensor& teacher, const std::optional<at::Tensor>& label_opt,
                             const at::Tensor& row_stats, double beta, double temperature,
                             int64_t ignore_index, std::string_view reduction_name,
                             JsdRowsKernel kernel) {
  constexpr const char* op = "fuseops::jsd_backward";
  const at::Tensor label = undefined_if_none(label_opt);
  const JsdReduction reduction =
      check_inputs(op, student, teacher, label, beta, temperature, reduction_name);
  check_floating_input(op, "grad_output", grad_output);
  check_same_device(op, "grad_output", grad_output, "student_logits", student);
  const at::IntArrayRef loss_shape =
      reduction == JsdReduction::None ? rows_shape(student) : at::IntArrayRef();
  TORCH_CHECK(grad_output.sizes() == loss_shape, op,
              ": argument 'grad_output' must have the loss's shape ", loss_shape, ", got ",
              grad_output.sizes());
  const at::ScalarType opmath = at::toOpMathType(student.scalar_type());
  const int64_t rows = c10::multiply_integers(rows_shape(student));
  check_defined(op, "row_stats", row_stats);
  TORCH_CHECK(row_stats.scalar_type() == opmath, op, ": argument 'row_stats' must have dtype ",
              opmath, " (the computation dtype of 'student_logits'), got ",
              row_stats.scalar_type());
  check_same_device(op, "row_stats", row_stats, "student_logits", student);
  TORCH_CHECK(row_stats.dim() == 2 && row_stats.size(0) == rows && row_stats.size(1) == 3, op,
              ": argument 'row_stats' must have shape [", rows, ", 3], got ", row_stats.sizes());
  at::Tensor grad = empty_contiguous_like(student);
  if (kernel == nullptr || student.numel() == 0) {
    return grad;
  }
  const Prepared p = prepare(student, teacher, label);
  at::Tensor grad_scale = grad_output.to(opmath);
  if (reduction == JsdReduction::None) {
    grad_scale = grad_scale.reshape({-1}).contiguous();
  } else if (reduction != JsdReduction::Sum) {
    grad_scale = grad_scale / divisor(student, label, ignore_index, reduction, opmath);
  }
  kernel({at::Tensor(),
          row_stats.contiguous(),
          grad.view(p.student.sizes()),
          grad_scale,
          p.student,
          p.teacher,
          p.label,
          {beta, temperature, ignore_index}});
  return grad;
}

namespace {

// The checks of a linear layer's input ([N, H]) and weight ([V, H]) named
// `input_name` and `weight_name`, in the dtype and on the device of `like`
// (`like_name`; the layer itself when `like` is `input`).
void check_linear(const char* op, const char* input_name, const at::Tensor& input,
                  const char* weight_name, const at::Tensor& weight, const char* like_name,
                  const at::Tensor& like) {
  check_floating_input(op, input_name, input);
  check_floating_input(op, weight_name, weight);
  TORCH_CHECK(input.dim() == 2, op, ": argument '", input_name, "' must have shape [N, H], got ",
              input.sizes());
  if (&input != &like) {
    check_same_dtype(op, input_name, input, like_name, like);
    check_same_device(op, input_name, input, like_name, like);
  }
  check_same_dtype(op, weight_name, weight, input_name, input);
  check_same_device(op, weight_name, weight, input_name, input);
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == input.size(1), op, ": argument '", weight_name,
              "' must have shape [V, ", input.size(1), "] (H, the last dimension of '", input_name,
              "'), got ", weight.sizes());
}

}  // namespace

FusedLinearJsdResult fused_linear_jsd_with(
    const char* op, const at::Tensor& student_input, const at::Tensor& student_weight,
    const at::Tensor& teacher_input, const at::Tensor& teacher_weight,
    const std::optional<at::Tensor>& label_opt, double beta, double temperature,
    int64_t ignore_index, std::string_view reduction_name, LinearLossGradient gradient,
    const at::Tensor& grad_output, JsdRowsKernel kernel) {
  const JsdReduction reduction = parse_jsd_reduction(op, reduction_name);
  check_linear(op, "student_input", student_input, "student_weight", student_weight,
               "student_input", student_input);
  // The row kernel takes both logits in one dtype.
  check_linear(op, "teacher_input", teacher_input, "teacher_weight", teacher_weight,
               "student_input", student_input);
  const int64_t rows = student_input.size(0);
  const int64_t hidden = student_input.size(1);
  const int64_t vocab = student_weight.size(0);
  TORCH_CHECK(teacher_input.size(0) == rows, op, ": argument 'teacher_input' must have ", rows,
              " rows (the first dimension of 'student_input'), got ", teacher_input.sizes());
  TORCH_CHECK(teacher_weight.size(0) == vocab, op, ": argument 'teacher_weight' must have ", vocab,
              " rows (the classes, the first dimension of 'student_weight'), got ",
              teacher_weight.sizes());
  TORCH_CHECK(vocab >= 1, op,
              ": argument 'student_weight' must have at least one class in its first dimension, "
              "got ",
              student_weight.sizes());
  const at::Tensor label = undefined_if_none(label_opt);
  check_label(op, label, student_input, "student_input", {rows},
              " (the first dimension of 'student_input')");
  check_options(op, beta, temperature);
  const bool with_grad = gradient != LinearLossGradient::None;
  const at::IntArrayRef loss_shape =
      reduction == JsdReduction::None ? student_input.sizes().slice(0, 1) : at::IntArrayRef();
  if (gradient == LinearLossGradient::OfGradOutput) {
    check_defined(op, "grad_output", grad_output);
    check_floating_input(op, "grad_output", grad_output);
    check_same_device(op, "grad_output", grad_output, "student_input", student_input);
    TORCH_CHECK(grad_output.sizes() == loss_shape, op,
                ": argument 'grad_output' must have the loss's shape ", loss_shape, ", got ",
                grad_output.sizes());
  }

  const auto options = student_input.options();
  const at::ScalarType opmath = at::toOpMathType(student_input.scalar_type());
  const auto opmath_options = options.dtype(opmath);
  FusedLinearJsdResult r;
  r.loss = empty_output(loss_shape, options);
  r.grad_input = empty_output(with_grad ? student_input.sizes() : at::IntArrayRef({0}), options);
  r.grad_weight = empty_output(with_grad ? student_weight.sizes() : at::IntArrayRef({0}), options);
  if (kernel == nullptr) {
    return r;
  }

  const at::Tensor xs = student_input.contiguous();
  const at::Tensor ws = student_weight.contiguous();
  const at::Tensor xt = teacher_input.contiguous();
  const at::Tensor lbl = label.defined() ? label.to(at::kLong).contiguous() : at::Tensor();
  // The gradient's scale: 0-d for every row alike, or [N] per row (the
  // backward of reduction "none"); "batchmean" and "mean" divide it by what
  // they divide the loss by, known before the first chunk.
  at::Tensor scale = gradient == LinearLossGradient::OfGradOutput
                         ? grad_output.to(opmath).reshape({-1}).contiguous()
                         : at::ones({}, opmath_options);
  if (gradient == LinearLossGradient::OfGradOutput && reduction != JsdReduction::None) {
    scale = scale.reshape(at::IntArrayRef());
  }
  if (reduction == JsdReduction::Mean || reduction == JsdReduction::BatchMean) {
    scale = scale / divisor(rows, vocab, lbl, ignore_index, reduction, opmath_options);
  }

  // Three [chunk, V] buffers (student and teacher logits, the student's
  // gradient: the CUDA kernel may not write its input) and the chunk's row
  // statistics: the memory of the op beyond its outputs and the float32
  // weight gradient.
  const int64_t chunk = linear_loss_chunk_rows(rows, hidden, vocab);
  const int64_t chunk_rows = std::max<int64_t>(chunk, 0);
  at::Tensor student_buffer = empty_output({chunk_rows, vocab}, options);
  at::Tensor teacher_buffer = empty_output({chunk_rows, vocab}, options);
  at::Tensor grad_buffer = empty_output({with_grad ? chunk_rows : 0, vocab}, options);
  at::Tensor stats_buffer = empty_output({chunk_rows, 3}, opmath_options);
  at::Tensor loss_rows = empty_output({rows}, opmath_options);
  LinearLossHead student_head(ws, at::Tensor(), with_grad ? r.grad_weight : at::Tensor(),
                              at::Tensor());
  LinearLossHead teacher_head(teacher_weight.contiguous(), at::Tensor(), at::Tensor(),
                              at::Tensor());
  const JsdOptions jsd_options{beta, temperature, ignore_index};
  for (int64_t start = 0; start < rows; start += chunk) {
    const int64_t n = std::min(chunk, rows - start);
    const at::Tensor x_chunk = xs.narrow(0, start, n);
    at::Tensor student = student_buffer.narrow(0, 0, n);
    at::Tensor teacher = teacher_buffer.narrow(0, 0, n);
    at::Tensor stats = stats_buffer.narrow(0, 0, n);
    student_head.logits(student, x_chunk);
    teacher_head.logits(teacher, xt.narrow(0, start, n));
    const at::Tensor label_chunk = lbl.defined() ? lbl.narrow(0, start, n) : at::Tensor();
    kernel({loss_rows.narrow(0, start, n), stats, at::Tensor(), at::Tensor(), student, teacher,
            label_chunk, jsd_options});
    if (!with_grad) {
      continue;
    }
    at::Tensor grad = grad_buffer.narrow(0, 0, n);
    kernel({at::Tensor(), stats, grad, scale.dim() == 0 ? scale : scale.narrow(0, start, n),
            student, teacher, label_chunk, jsd_options});
    student_head.backward(grad, x_chunk, r.grad_input.narrow(0, start, n));
  }
  student_head.finish();
  r.loss.copy_(reduce_rows(loss_rows, vocab, loss_shape, lbl, ignore_index, reduction, opmath));
  return r;
}

}  // namespace detail

// C++ API: through the dispatcher, so autograd and the device kernels apply.
// Undefined tensors carry no dispatch key, so they are rejected here, before
// the dispatcher would fail with a message that names no argument.
using detail::find_op;
using detail::none_if_undefined;

at::Tensor jsd(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
               const std::optional<at::Tensor>& label, double beta, double temperature,
               int64_t ignore_index, std::string_view reduction) {
  constexpr const char* name = "fuseops::jsd";
  check_floating_input(name, "student_logits", student_logits);
  check_floating_input(name, "teacher_logits", teacher_logits);
  static auto op = find_op<decltype(jsd)>(name);
  return op.call(student_logits, teacher_logits, none_if_undefined(label), beta, temperature,
                 ignore_index, reduction);
}

std::tuple<at::Tensor, at::Tensor> jsd_forward(const at::Tensor& student_logits,
                                               const at::Tensor& teacher_logits,
                                               const std::optional<at::Tensor>& label, double beta,
                                               double temperature, int64_t ignore_index,
                                               std::string_view reduction) {
  constexpr const char* name = "fuseops::jsd_forward";
  check_floating_input(name, "student_logits", student_logits);
  check_floating_input(name, "teacher_logits", teacher_logits);
  static auto op = find_op<decltype(jsd_forward)>(name);
  return op.call(student_logits, teacher_logits, none_if_undefined(label), beta, temperature,
                 ignore_index, reduction);
}

at::Tensor jsd_backward(const at::Tensor& grad_output, const at::Tensor& student_logits,
                        const at::Tensor& teacher_logits, const std::optional<at::Tensor>& label,
                        const at::Tensor& row_stats, double beta, double temperature,
                        int64_t ignore_index, std::string_view reduction) {
  constexpr const char* name = "fuseops::jsd_backward";
  check_floating_input(name, "grad_output", grad_output);
  check_floating_input(name, "student_logits", student_logits);
  check_floating_input(name, "teacher_logits", teacher_logits);
  static auto op = find_op<decltype(jsd_backward)>(name);
  return op.call(grad_output, student_logits, teacher_logits, none_if_undefined(label), row_stats,
                 beta, temperature, ignore_index, reduction);
}

namespace {

// The entry points taking the two linear layers: their checks of what the
// dispatcher cannot name, then the call; the arguments after them pass
// through.
template <typename Op, typename... Rest>
auto call_with_layers(const Op& op, const at::Tensor& student_input,
                      const at::Tensor& student_weight, const at::Tensor& teacher_input,
                      const at::Tensor& teacher_weight, const std::optional<at::Tensor>& label,
                      const Rest&... rest) {
  const char* name = op.operator_name().name.c_str();
  check_floating_input(name, "student_input", student_input);
  check_floating_input(name, "student_weight", student_weight);
  check_floating_input(name, "teacher_input", teacher_input);
  check_floating_input(name, "teacher_weight", teacher_weight);
  return op.call(student_input, student_weight, teacher_input, teacher_weight,
                 none_if_undefined(label), rest...);
}

}  // namespace

at::Tensor fused_linear_jsd(const at::Tensor& student_input, const at::Tensor& student_weight,
                            const at::Tensor& teacher_input, const at::Tensor& teacher_weight,
                            const std::optional<at::Tensor>& label, double beta, double temperature,
                            int64_t ignore_index, std::string_view reduction) {
  static auto op = find_op<decltype(fused_linear_jsd)>("fuseops::fused_linear_jsd");
  return call_with_layers(op, student_input, student_weight, teacher_input, teacher_weight, label,
                          beta, temperature, ignore_index, reduction);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_linear_jsd_forward(
    const at::Tensor& student_input, const at::Tensor& student_weight,
    const at::Tensor& teacher_input, const at::Tensor& teacher_weight,
    const std::optional<at::Tensor>& label, double beta, double temperature, int64_t ignore_index,
    std::string_view reduction) {
  static auto op = find_op<decltype(fused_linear_jsd_forward)>("fuseops::fused_linear_jsd_forward");
  return call_with_layers(op, student_input, student_weight, teacher_input, teacher_weight, label,
                          beta, temperature, ignore_index, reduction);
}

std::tuple<at::Tensor, at::Tensor> fused_linear_jsd_backward(
    const at::Tensor& grad_output, const at::Tensor& student_input,
    const at::Tensor& student_weight, const at::Tensor& teacher_input,
    const at::Tensor& teacher_weight, const std::optional<at::Tensor>& label, double beta,
    double temperature, int64_t ignore_index, std::string_view reduction) {
  constexpr const char* name = "fuseops::fused_linear_jsd_backward";
  check_floating_input(name, "grad_output", grad_output);
  check_floating_input(name, "student_input", student_input);
  check_floating_input(name, "student_weight", student_weight);
  check_floating_input(name, "teacher_input", teacher_input);
  check_floating_input(name, "teacher_weight", teacher_weight);
  static auto op = find_op<decltype(fused_linear_jsd_backward)>(name);
  return op.call(grad_output, student_input, student_weight, teacher_input, teacher_weight,
                 none_if_undefined(label), beta, temperature, ignore_index, reduction);
}

// Autocast as torch's kl_div (and cross_entropy): float32 logits, so a
// float32 loss, on CPU and CUDA; a bfloat16 student with a float32 teacher
// then meets the teacher's dtype.
FUSEOPS_AUTOCAST(jsd, kFloat32, kFloat32)
// fused_linear_jsd as the composition it replaces, jsd(linear(student_input,
// student_weight), linear(teacher_input, teacher_weight)): the GEMMs in the
// autocast dtype (float32 heads under bfloat16 autocast, as
// Trainer(bf16=True) has them) and a float32 loss, as linear_cross_entropy.
FUSEOPS_AUTOCAST(fused_linear_jsd, kLinearLoss, kLinearLoss)

}  // namespace fuseops
