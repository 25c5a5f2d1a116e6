// fuseops::jsd: schemas, C++ API, shared checks and the Meta registration.
// CPU: cpp/ops/cpu/jsd.cpp; CUDA: cuda/jsd_kernel.cu; autograd:
// cpp/ops/autograd/jsd.cpp.

#include "ops/jsd.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <ATen/OpMathType.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/sum.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include <fuseops/jsd.h>

#include "ops/common/autocast.h"
#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
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

// The checks every entry point shares; returns the reduction.
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
  if (label.defined()) {
    TORCH_CHECK(label.scalar_type() == at::kLong || label.scalar_type() == at::kInt, op,
                ": argument 'label' must hold class indices of dtype int64 or int32, got ",
                label.scalar_type());
    check_same_device(op, "label", label, "student_logits", student);
    const auto rows_shape = student.sizes().slice(0, student.dim() - 1);
    TORCH_CHECK(label.sizes() == rows_shape, op, ": argument 'label' must have shape ", rows_shape,
                " (the shape of 'student_logits' without its last, class dimension), got ",
                label.sizes());
  }
  TORCH_CHECK(beta >= 0.0 && beta <= 1.0, op, ": argument 'beta' must be in [0, 1], got ", beta);
  // The kernels divide by the temperature in float32 for all but float64
  // logits: it and its reciprocal must be finite there.
  TORCH_CHECK(temperature > 0.0 && std::isfinite(static_cast<float>(temperature)) &&
                  std::isfinite(static_cast<float>(1.0 / temperature)),
              op,
              ": argument 'temperature' must be a number > 0 whose value and reciprocal are "
              "finite in float32, got ",
              temperature);
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
// counted rows (times V for "mean"), at least one, as an opmath 0-d tensor
// on the logits' device.
at::Tensor divisor(const at::Tensor& student, const at::Tensor& label, int64_t ignore_index,
                   JsdReduction reduction, at::ScalarType opmath) {
  const int64_t vocab = student.size(-1);
  const int64_t per_row = reduction == JsdReduction::Mean ? vocab : 1;
  if (!label.defined()) {
    const int64_t rows = c10::multiply_integers(rows_shape(student));
    return at::scalar_tensor(static_cast<double>(std::max<int64_t>(rows, 1) * per_row),
                             student.options().dtype(opmath));
  }
  return at::ne(label, ignore_index).sum().clamp_min(1).to(opmath) * static_cast<double>(per_row);
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
  const at::ScalarType dtype = student.scalar_type();
  switch (reduction) {
    case JsdReduction::None:
      return {loss_rows.to(dtype).view(rows_shape(student)), row_stats};
    case JsdReduction::Sum:
      return {loss_rows.sum().to(dtype), row_stats};
    case JsdReduction::Mean:
    case JsdReduction::BatchMean:
      break;
  }
  return {(loss_rows.sum() / divisor(student, label, ignore_index, reduction, opmath)).to(dtype),
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
  TORCH_CHECK(row_stats.defined(), op,
              ": argument 'row_stats' must be a defined tensor, got an undefined tensor");
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
  TORCH_CHECK(row_stats.defined(), name,
              ": argument 'row_stats' must be a defined tensor, got an undefined tensor");
  static auto op = find_op<decltype(jsd_backward)>(name);
  return op.call(grad_output, student_logits, teacher_logits, none_if_undefined(label), row_stats,
                 beta, temperature, ignore_index, reduction);
}

namespace {

struct MetaKernels {
  static detail::JsdRowsKernel rows() { return nullptr; }
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(fuseops, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  m.def(
      "jsd(Tensor student_logits, Tensor teacher_logits, Tensor? label=None, float beta=0.5, "
      "float temperature=1.0, int ignore_index=-100, str reduction='batchmean') -> Tensor",
      tags);
  m.def(
      "jsd_forward(Tensor student_logits, Tensor teacher_logits, Tensor? label=None, "
      "float beta=0.5, float temperature=1.0, int ignore_index=-100, "
      "str reduction='batchmean') -> (Tensor, Tensor)",
      tags);
  m.def(
      "jsd_backward(Tensor grad_output, Tensor student_logits, Tensor teacher_logits, "
      "Tensor? label, Tensor row_stats, float beta, float temperature, int ignore_index, "
      "str reduction) -> Tensor",
      tags);
}

TORCH_LIBRARY_IMPL(fuseops, Meta, m) { detail::JsdRegistrations<MetaKernels>::register_all(m); }

// Autocast as torch's kl_div (and cross_entropy): float32 logits, so a
// float32 loss, on CPU and CUDA; a bfloat16 student with a float32 teacher
// then meets the teacher's dtype.
FUSEOPS_AUTOCAST(jsd, kFloat32, kFloat32)

}  // namespace fuseops
