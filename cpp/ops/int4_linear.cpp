// fuseops int4 linear layers: the C++ API, the shared checks and the `*_with`
// entry points that every backend's kernels go through; the quantization and
// packing ops (ATen ops only, one registration for every backend, with Meta
// kernels of their own since they check values). The schemas and the Meta, CPU
// and CUDA registrations are generated from cpp/ops/int4_linear.yaml. CPU
// kernels: cpp/ops/cpu/int4_dynamic_linear_kernel.cpp,
// cpp/ops/cpu/int4_linear_kernel.cpp; CUDA: cuda/int4_linear_kernel.cu;
// autograd: none (`autograd:` in cpp/ops/int4_linear.yaml declares its
// refusals).

#include "ops/int4_linear.h"

#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/amin.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/bitwise_left_shift.h>
#include <ATen/ops/bitwise_or.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/round.h>
#include <ATen/ops/where.h>
#include <torch/library.h>

#include <fuseops/int4_linear.h>

#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/linear_output.h"
#include "ops/common/output_memory.h"
#include "ops/common/tensors.h"

namespace fuseops {
namespace detail {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_group_size(const char* op, int64_t group_size) {
  TORCH_CHECK(group_size > 0 && group_size % 2 == 0, op,
              ": argument 'group_size' must be a positive even number (K values are packed in "
              "pairs), got ",
              group_size);
}

// The checks quantize_per_group_int4 makes on every backend (Meta included).
void check_quantize(const at::Tensor& weight, int64_t group_size) {
  constexpr const char* op = "fuseops::quantize_per_group_int4";
  check_floating_input(op, "weight", weight);
  TORCH_CHECK(weight.dim() == 2, op,
              ": argument 'weight' must be 2-D [out_features, in_features], got shape ",
              weight.sizes());
  TORCH_CHECK(group_size > 0, op, ": argument 'group_size' must be positive, got ", group_size);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_outputs(const at::Tensor& weight,
                                                                int64_t group_size) {
  const int64_t n = weight.size(0);
  const int64_t groups = ceil_div(weight.size(1), group_size);
  const auto options = weight.options();
  return {empty_output(weight.sizes(), options.dtype(at::kByte)),
          empty_output({n, groups}, options.dtype(at::kFloat)),
          empty_output({n, groups}, options.dtype(at::kByte))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_per_group_int4_meta(
    const at::Tensor& weight, int64_t group_size, bool /*symmetric*/) {
  check_quantize(weight, group_size);
  return quantize_outputs(weight, group_size);
}

// Every backend but Meta: the rule of cpp/include/fuseops/int4_linear.h in
// float32 ATen ops.
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_per_group_int4_impl(
    const at::Tensor& weight, int64_t group_size, bool symmetric) {
  constexpr const char* op = "fuseops::quantize_per_group_int4";
  check_quantize(weight, group_size);
  auto [wq, scale, zero] = quantize_outputs(weight, group_size);
  const int64_t n = weight.size(0);
  const int64_t k = weight.size(1);
  const int64_t groups = scale.size(1);
  if (n == 0 || k == 0) {
    return {wq, scale, zero};
  }
  const at::Tensor w = weight.to(at::kFloat);
  TORCH_CHECK(at::isfinite(w).all().item<bool>(), op,
              ": argument 'weight' must be finite, but it holds Inf or NaN",
              weight.scalar_type() == at::kDouble ? " or a value beyond float32's range" : "");
  // Zeros past K change neither a group's largest magnitude nor its range
  // (which always holds 0).
  const at::Tensor grouped =
      at::constant_pad_nd(w, {0, groups * group_size - k}, 0).view({n, groups, group_size});
  at::Tensor s;
  at::Tensor z;
  if (symmetric) {
    const at::Tensor extreme =
        grouped.gather(-1, grouped.abs().argmax(-1, /*keepdim=*/true)).squeeze(-1);
    s = extreme / -8.0;
    z = at::full_like(s, 8.0);
  } else {
    const at::Tensor lo = grouped.amin(-1).clamp_max(0);
    const at::Tensor hi = grouped.amax(-1).clamp_min(0);
    // hi / 15 - lo / 15 rather than (hi - lo) / 15: no overflow near
    // float32's largest values.
    s = hi / 15.0 - lo / 15.0;
    z = at::round(-lo / at::where(s == 0, 1.0, s)).clamp(0, 15);
  }
  // An all-zero group, or one so small that its scale underflows: scale 1,
  // every value quantizes to the zero point.
  s = at::where(s == 0, 1.0, s);
  const at::Tensor q = (at::round(grouped / s.unsqueeze(-1)) + z.unsqueeze(-1)).clamp(0, 15);
  wq.copy_(q.view({n, groups * group_size}).narrow(1, 0, k));
  scale.copy_(s);
  zero.copy_(z);
  return {wq, scale, zero};
}

// The checks pack_int4_weight makes on every backend (Meta included).
void check_pack(const at::Tensor& wq, const at::Tensor& scale, const at::Tensor& zero,
                int64_t group_size) {
  constexpr const char* op = "fuseops::pack_int4_weight";
  check_defined(op, "wq", wq);
  check_defined(op, "scale", scale);
  check_defined(op, "zero", zero);
  TORCH_CHECK(wq.scalar_type() == at::kByte, op,
              ": argument 'wq' must have dtype uint8 (from fuseops.quantize_per_group_int4), got ",
              wq.scalar_type());
  TORCH_CHECK(wq.dim() == 2, op, ": argument 'wq' must be 2-D [N, K], got shape ", wq.sizes());
  check_group_size(op, group_size);
  const int64_t groups = ceil_div(wq.size(1), group_size);
  const std::vector<int64_t> want{wq.size(0), groups};
  TORCH_CHECK(scale.scalar_type() == at::kFloat, op,
              ": argument 'scale' must have dtype float32, got ", scale.scalar_type());
  TORCH_CHECK(scale.sizes() == at::IntArrayRef(want), op, ": argument 'scale' must have shape ",
              at::IntArrayRef(want), " ([N, ceil(K / group_size)] for 'wq' of shape ", wq.sizes(),
              " and group_size ", group_size, "), got ", scale.sizes());
  TORCH_CHECK(zero.scalar_type() == at::kByte, op, ": argument 'zero' must have dtype uint8, got ",
              zero.scalar_type());
  TORCH_CHECK(zero.sizes() == at::IntArrayRef(want), op, ": argument 'zero' must have shape ",
              at::IntArrayRef(want), " (that of 'scale'), got ", zero.sizes());
  check_same_device(op, "scale", scale, "wq", wq);
  check_same_device(op, "zero", zero, "wq", wq);
}

std::tuple<at::Tensor, at::Tensor> pack_outputs(const at::Tensor& wq, const at::Tensor& scale,
                                                int64_t group_size) {
  const int64_t n = wq.size(0);
  const int64_t groups = scale.size(1);
  return {
      empty_output({ceil_div(n, kInt4BlockN), groups * group_size / 2, kInt4BlockN}, wq.options()),
      empty_output({groups, 2, n}, scale.options())};
}

std::tuple<at::Tensor, at::Tensor> pack_int4_weight_meta(const at::Tensor& wq,
                                                         const at::Tensor& scale,
                                                         const at::Tensor& zero,
                                                         int64_t group_size) {
  check_pack(wq, scale, zero, group_size);
  return pack_outputs(wq, scale, group_size);
}

// Every backend but Meta: a zero pad, the nibble pairs, a permutation.
std::tuple<at::Tensor, at::Tensor> pack_int4_weight_impl(const at::Tensor& wq,
                                                         const at::Tensor& scale,
                                                         const at::Tensor& zero,
                                                         int64_t group_size) {
  constexpr const char* op = "fuseops::pack_int4_weight";
  check_pack(wq, scale, zero, group_size);
  auto [packed, scale_zero] = pack_outputs(wq, scale, group_size);
  const int64_t n = wq.size(0);
  const int64_t k = wq.size(1);
  if (wq.numel() > 0) {
    TORCH_CHECK(wq.max().item<int64_t>() <= 15, op,
                ": argument 'wq' must hold values in [0, 15] (4 bits), got ",
                wq.max().item<int64_t>());
    TORCH_CHECK(zero.max().item<int64_t>() <= 15, op,
                ": argument 'zero' must hold values in [0, 15] (4 bits), got ",
                zero.max().item<int64_t>());
  }
  const int64_t blocks = packed.size(0);
  const int64_t pairs = packed.size(1);
  if (packed.numel() > 0) {
    const at::Tensor padded =
        at::constant_pad_nd(wq, {0, 2 * pairs - k, 0, blocks * kInt4BlockN - n}, 0)
            .view({blocks, kInt4BlockN, pairs, 2});
    const at::Tensor bytes =
        at::bitwise_or(padded.select(3, 0), at::bitwise_left_shift(padded.select(3, 1), 4));
    packed.copy_(bytes.permute({0, 2, 1}));
  }
  scale_zero.select(1, 0).copy_(scale.t());
  scale_zero.select(1, 1).copy_(zero.t());
  return {packed, scale_zero};
}

void check_int4_weight(const char* op, const at::Tensor& packed, const at::Tensor& scale_zero,
                       int64_t group_size, const at::Tensor& input) {
  check_defined(op, "packed", packed);
  check_defined(op, "scale_zero", scale_zero);
  TORCH_CHECK(packed.scalar_type() == at::kByte, op,
              ": argument 'packed' must have dtype uint8 (from fuseops.pack_int4_weight), got ",
              packed.scalar_type());
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kInt4BlockN, op,
              ": argument 'packed' must have shape [ceil(N/16), groups * group_size / 2, 16] "
              "(from fuseops.pack_int4_weight), got ",
              packed.sizes());
  TORCH_CHECK(scale_zero.scalar_type() == at::kFloat || scale_zero.scalar_type() == at::kBFloat16,
              op, ": argument 'scale_zero' must have dtype float32 or bfloat16, got ",
              scale_zero.scalar_type());
  TORCH_CHECK(scale_zero.dim() == 3 && scale_zero.size(1) == 2, op,
              ": argument 'scale_zero' must have shape [groups, 2, N] (from "
              "fuseops.pack_int4_weight), got ",
              scale_zero.sizes());
  check_group_size(op, group_size);
  const int64_t n = scale_zero.size(2);
  const int64_t groups = scale_zero.size(0);
  TORCH_CHECK(packed.size(0) == ceil_div(n, kInt4BlockN), op, ": argument 'packed' holds ",
              packed.size(0), " blocks of 16 output channels, but 'scale_zero' has N = ", n,
              " channels (ceil(N/16) = ", ceil_div(n, kInt4BlockN), " blocks)");
  TORCH_CHECK(2 * packed.size(1) == groups * group_size, op, ": argument 'packed' holds ",
              2 * packed.size(1), " input features per channel, but 'scale_zero' has ", groups,
              " groups of group_size ", group_size, " (", groups * group_size,
              "): was the weight packed with another group_size?");
  const int64_t k = input.size(-1);
  TORCH_CHECK(ceil_div(k, group_size) == groups, op, ": argument 'input' has K = ", k,
              " (its last dimension), but the packed weight holds ", groups, " groups of ",
              group_size, " input features (K in [", groups * group_size - group_size + 1, ", ",
              groups * group_size, "]); input shape ", input.sizes());
  check_same_device(op, "packed", packed, "input", input);
  check_same_device(op, "scale_zero", scale_zero, "input", input);
}

// The int4 linear ops' shared entry: checks, output and the kernel call
// (W4A16 and W4A8 take the same arguments and packed weights).
at::Tensor int4_linear_with(const char* op, const at::Tensor& input, const at::Tensor& packed,
                            const at::Tensor& scale_zero, int64_t group_size,
                            const std::optional<at::Tensor>& bias,
                            Int4WeightOnlyLinearKernel kernel) {
  check_floating_input(op, "input", input);
  TORCH_CHECK(input.dim() >= 1, op,
              ": argument 'input' must have at least one dimension [..., K], got a 0-d tensor");
  check_int4_weight(op, packed, scale_zero, group_size, input);
  const int64_t n = scale_zero.size(2);
  const int64_t k = input.size(-1);
  const at::Tensor b = undefined_if_none(bias);
  at::Tensor out = linear_output(op, input, b, n, "scale_zero");
  if (!linear_needs_kernel(out, b, k, kernel != nullptr)) {
    return out;
  }
  kernel(out, input.reshape({-1, k}).contiguous(), packed.contiguous(), scale_zero.contiguous(),
         group_size, contiguous_if_defined(b));
  return out;
}

}  // namespace

at::Tensor int4_weight_only_linear_with(const at::Tensor& input, const at::Tensor& packed,
                                        const at::Tensor& scale_zero, int64_t group_size,
                                        const std::optional<at::Tensor>& bias,
                                        Int4WeightOnlyLinearKernel kernel) {
  return int4_linear_with("fuseops::int4_weight_only_linear", input, packed, scale_zero, group_size,
                          bias, kernel);
}

at::Tensor int4_dynamic_linear_with(const at::Tensor& input, const at::Tensor& packed,
                                    const at::Tensor& scale_zero, int64_t group_size,
                                    const std::optional<at::Tensor>& bias,
                                    Int4DynamicLinearKernel kernel) {
  return int4_linear_with("fuseops::int4_dynamic_linear", input, packed, scale_zero, group_size,
                          bias, kernel);
}

}  // namespace detail

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_per_group_int4(const at::Tensor& weight,
                                                                       int64_t group_size,
                                                                       bool symmetric) {
  check_floating_input("fuseops::quantize_per_group_int4", "weight", weight);
  static auto op =
      detail::find_op<decltype(quantize_per_group_int4)>("fuseops::quantize_per_group_int4");
  return op.call(weight, group_size, symmetric);
}

std::tuple<at::Tensor, at::Tensor> pack_int4_weight(const at::Tensor& wq, const at::Tensor& scale,
                                                    const at::Tensor& zero, int64_t group_size) {
  constexpr const char* op = "fuseops::pack_int4_weight";
  static auto handle = detail::find_op<decltype(pack_int4_weight)>(op);
  return handle.call(wq, scale, zero, group_size);
}

at::Tensor int4_weight_only_linear(const at::Tensor& input, const at::Tensor& packed,
                                   const at::Tensor& scale_zero, int64_t group_size,
                                   const std::optional<at::Tensor>& bias) {
  constexpr const char* op = "fuseops::int4_weight_only_linear";
  check_floating_input(op, "input", input);
  static auto handle = detail::find_op<decltype(int4_weight_only_linear)>(op);
  return handle.call(input, packed, scale_zero, group_size, detail::none_if_undefined(bias));
}

at::Tensor int4_dynamic_linear(const at::Tensor& input, const at::Tensor& packed,
                               const at::Tensor& scale_zero, int64_t group_size,
                               const std::optional<at::Tensor>& bias) {
  constexpr const char* op = "fuseops::int4_dynamic_linear";
  check_floating_input(op, "input", input);
  static auto handle = detail::find_op<decltype(int4_dynamic_linear)>(op);
  return handle.call(input, packed, scale_zero, group_size, detail::none_if_undefined(bias));
}

TORCH_LIBRARY_IMPL(fuseops, CompositeExplicitAutograd, m) {
  m.impl("quantize_per_group_int4", TORCH_FN(detail::quantize_per_group_int4_impl));
  m.impl("pack_int4_weight", TORCH_FN(detail::pack_int4_weight_impl));
}

TORCH_LIBRARY_IMPL(fuseops, Meta, m) {
  m.impl("quantize_per_group_int4", TORCH_FN(detail::quantize_per_group_int4_meta));
  m.impl("pack_int4_weight", TORCH_FN(detail::pack_int4_weight_meta));
}

}  // namespace fuseops
