// fuseops 2:4 sparse linear layers: the C++ API, the shared checks and the
// `*_with` entry points that every backend's kernels go through; the pruning
// and packing ops (ATen ops, one registration for CPU and CUDA, a shape-only
// Meta form). The schemas and the linear ops' Meta, CPU and CUDA
// registrations are generated from cpp/ops/sparse_2_4.yaml. CPU kernels:
// cpp/ops/cpu/sparse_2_4_kernel.cpp; CUDA: cuda/sparse_2_4_kernel.cu; autograd:
// none (`autograd:` in cpp/ops/sparse_2_4.yaml declares its refusals).

#include "ops/sparse_2_4.h"
#include "ops/int8_linear.h"

#include <limits>
#include <vector>

#include <ATen/ops/abs.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/masked_select.h>
#include <ATen/ops/nan_to_num.h>
#include <ATen/ops/nonzero.h>
#include <torch/library.h>

#include <fuseops/sparse_2_4.h>

#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/linear_output.h"
#include "ops/common/output_memory.h"
#include "ops/common/tensors.h"

namespace fuseops {
namespace detail {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool is_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

void check_weight_2d(const char* op, const at::Tensor& weight, bool allow_int8) {
  check_defined(op, "weight", weight);
  TORCH_CHECK(is_float(weight.scalar_type()) || (allow_int8 && weight.scalar_type() == at::kChar),
              op, ": argument 'weight' must have dtype float32, float64, bfloat16, float16",
              allow_int8 ? " or int8" : "", ", got ", weight.scalar_type());
  TORCH_CHECK(weight.dim() == 2, op, ": argument 'weight' must be 2-D [N, K], got shape ",
              weight.sizes());
  TORCH_CHECK(weight.size(1) % kSparseGroupK == 0, op,
              ": argument 'weight' must have K (its last dimension) a multiple of 4 (groups of "
              "4 input features), got shape ",
              weight.sizes());
}

void check_scale(const char* op, const at::Tensor& scale, int64_t n, const char* n_from,
                 const at::Tensor& ref, const char* ref_arg) {
  TORCH_CHECK(scale.scalar_type() == at::kFloat, op,
              ": argument 'scale' must have dtype float32, got ", scale.scalar_type());
  TORCH_CHECK(scale.dim() == 1 && scale.size(0) == n, op, ": argument 'scale' must have shape [", n,
              "] (N, from ", n_from, "), got ", scale.sizes());
  check_same_device(op, "scale", scale, ref_arg, ref);
}

void check_pack_inputs(const at::Tensor& weight, const at::Tensor& scale) {
  constexpr const char* op = "fuseops::pack_2_4";
  check_weight_2d(op, weight, true);
  if (weight.scalar_type() == at::kChar) {
    TORCH_CHECK(scale.defined(), op,
                ": argument 'scale' is required for an int8 weight (its per-channel float32 "
                "scales, from fuseops.quantize_per_channel_int8), got None");
  }
  if (scale.defined()) {
    check_scale(op, scale, weight.size(0), "'weight'", weight, "weight");
  }
}

// The weight's kept positions: its nonzeros (NaN included) and, in groups
// with fewer than 2, the lowest-indexed zeros, so every group keeps 2.
// Refuses a group with more than 2 nonzeros.
at::Tensor kept_positions(const at::Tensor& weight) {
  const int64_t n = weight.size(0);
  const int64_t groups = weight.size(1) / kSparseGroupK;
  const at::Tensor nonzero = weight.ne(0).view({n, groups, kSparseGroupK});
  const at::Tensor count = nonzero.sum(-1);
  const at::Tensor over = count.gt(2);
  if (over.any().item<bool>()) {
    const at::Tensor first = at::nonzero(over)[0];
    const int64_t row = first[0].item<int64_t>();
    const int64_t group = first[1].item<int64_t>();
    TORCH_CHECK(false, "fuseops::pack_2_4: argument 'weight' is not 2:4 sparse: row ", row,
                ", group ", group, " (columns ", kSparseGroupK * group, "..",
                kSparseGroupK * group + 3, ") holds ", count[row][group].item<int64_t>(),
                " nonzero values, at most 2 of every 4 consecutive values along K may be "
                "nonzero (fuseops.prune_2_4 makes a weight 2:4)");
  }
  const at::Tensor zero = nonzero.logical_not();
  const at::Tensor zero_rank = at::cumsum(zero, -1, at::kLong);
  const at::Tensor filler = zero.logical_and(zero_rank.le(count.mul(-1).add(2).unsqueeze(-1)));
  return nonzero.logical_or(filler);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_outputs(const at::Tensor& weight) {
  const int64_t n = weight.size(0);
  const int64_t k = weight.size(1);
  return {empty_output({n, k / 2}, weight.options()),
          empty_output({n, ceil_div(k, 8)}, weight.options().dtype(at::kByte)),
          empty_output({n}, weight.options().dtype(at::kFloat))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_2_4_impl(const at::Tensor& weight,
                                                             const std::optional<at::Tensor>& s) {
  const at::Tensor scale = undefined_if_none(s);
  check_pack_inputs(weight, scale);
  auto [values, meta, scale_out] = pack_outputs(weight);
  const int64_t n = weight.size(0);
  const int64_t groups = weight.size(1) / kSparseGroupK;
  const at::Tensor keep = kept_positions(weight);
  values.copy_(at::masked_select(weight, keep.view(weight.sizes())).view(values.sizes()));
  // One nibble per group (bit j: position j kept), two groups per byte.
  at::Tensor nibbles = keep.select(2, 0).to(at::kInt);
  for (int64_t j = 1; j < kSparseGroupK; ++j) {
    nibbles = nibbles.add(keep.select(2, j).to(at::kInt).mul(1 << j));
  }
  nibbles =
      at::constant_pad_nd(nibbles, {0, 2 * meta.size(1) - groups}, 0).view({n, meta.size(1), 2});
  meta.copy_(nibbles.select(2, 0).add(nibbles.select(2, 1).mul(16)));
  if (scale.defined()) {
    scale_out.copy_(scale);
  } else {
    scale_out.fill_(1.0);
  }
  return {values, meta, scale_out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_2_4_meta(const at::Tensor& weight,
                                                             const std::optional<at::Tensor>& s) {
  check_pack_inputs(weight, undefined_if_none(s));
  return pack_outputs(weight);
}

at::Tensor prune_2_4_impl(const at::Tensor& weight) {
  check_weight_2d("fuseops::prune_2_4", weight, false);
  at::Tensor out = empty_contiguous_like(weight);
  if (weight.numel() == 0) {
    return out;
  }
  const int64_t n = weight.size(0);
  const int64_t groups = weight.size(1) / kSparseGroupK;
  // Magnitudes with NaN as the largest; rank_i counts the group's values
  // that beat value i (larger, or equal at a lower index): the 2 of rank
  // 0 and 1 are kept, so ties go to the lower index.
  const double inf = std::numeric_limits<double>::infinity();
  const at::Tensor a = at::nan_to_num(at::abs(weight), inf, inf).view({n, groups, kSparseGroupK});
  const at::Tensor index = at::arange(kSparseGroupK, a.options().dtype(at::kLong));
  at::Tensor rank;
  for (int64_t j = 0; j < kSparseGroupK; ++j) {
    const at::Tensor aj = a.narrow(2, j, 1);
    const at::Tensor beats = aj.gt(a).logical_or(aj.eq(a).logical_and(index.gt(j))).to(at::kInt);
    rank = rank.defined() ? rank.add(beats) : beats;
  }
  out.copy_(weight.masked_fill(rank.ge(2).view(weight.sizes()), 0));
  return out;
}

at::Tensor prune_2_4_meta(const at::Tensor& weight) {
  check_weight_2d("fuseops::prune_2_4", weight, false);
  return empty_contiguous_like(weight);
}

// The checks and the output both linear ops share; `int8_only`: values must
// be int8 (the W8A8 op).
at::Tensor prepare_linear(const char* op, const at::Tensor& input, const at::Tensor& values,
                          const at::Tensor& meta, const at::Tensor& scale, const at::Tensor& b,
                          bool int8_only) {
  check_floating_input(op, "input", input);
  TORCH_CHECK(input.dim() >= 1, op,
              ": argument 'input' must have at least one dimension [..., K], got a 0-d tensor");
  check_defined(op, "values", values);
  check_defined(op, "meta", meta);
  check_defined(op, "scale", scale);
  if (int8_only) {
    TORCH_CHECK(values.scalar_type() == at::kChar, op,
                ": argument 'values' must have dtype int8 (from fuseops.pack_2_4 of an int8 "
                "weight), got ",
                values.scalar_type());
  } else if (values.scalar_type() != at::kChar) {
    TORCH_CHECK(values.scalar_type() == input.scalar_type(), op,
                ": argument 'values' must have the input's dtype (", input.scalar_type(),
                ") or int8 (from fuseops.pack_2_4), got ", values.scalar_type());
  }
  TORCH_CHECK(values.dim() == 2, op,
              ": argument 'values' must be 2-D [N, K/2] (from fuseops.pack_2_4), got shape ",
              values.sizes());
  const int64_t n = values.size(0);
  const int64_t k = input.size(-1);
  TORCH_CHECK(
      k % kSparseGroupK == 0 && values.size(1) * 2 == k, op, ": argument 'input' has K = ", k,
      " (its last dimension), but 'values' holds the kept halves of K = ", 2 * values.size(1),
      " input features (shape ", values.sizes(), "); K must be a multiple of 4; input shape ",
      input.sizes());
  TORCH_CHECK(meta.scalar_type() == at::kByte, op,
              ": argument 'meta' must have dtype uint8 (from fuseops.pack_2_4), got ",
              meta.scalar_type());
  TORCH_CHECK(meta.dim() == 2 && meta.size(0) == n && meta.size(1) == ceil_div(k, 8), op,
              ": argument 'meta' must have shape [", n, ", ", ceil_div(k, 8),
              "] ([N, ceil(K/8)], from fuseops.pack_2_4), got ", meta.sizes());
  check_scale(op, scale, n, "'values'", input, "input");
  check_same_device(op, "values", values, "input", input);
  check_same_device(op, "meta", meta, "input", input);
  return linear_output(op, input, b, n, "values");
}

}  // namespace

at::Tensor sparse_2_4_linear_with(const at::Tensor& input, const at::Tensor& values,
                                  const at::Tensor& meta, const at::Tensor& scale,
                                  const std::optional<at::Tensor>& bias,
                                  Sparse24LinearKernel kernel) {
  const at::Tensor b = undefined_if_none(bias);
  at::Tensor out =
      prepare_linear("fuseops::sparse_2_4_linear", input, values, meta, scale, b, false);
  const int64_t k = input.size(-1);
  if (linear_needs_kernel(out, b, k, kernel != nullptr)) {
    kernel(out, input.reshape({-1, k}).contiguous(), values.contiguous(), meta.contiguous(),
           scale.contiguous(), contiguous_if_defined(b));
  }
  return out;
}

at::Tensor sparse_2_4_dynamic_linear_with(const at::Tensor& input, const at::Tensor& values,
                                          const at::Tensor& meta, const at::Tensor& scale,
                                          const at::Tensor& colsum,
                                          const std::optional<at::Tensor>& bias,
                                          Sparse24DynamicLinearKernel kernel) {
  constexpr const char* op = "fuseops::sparse_2_4_dynamic_linear";
  const at::Tensor b = undefined_if_none(bias);
  at::Tensor out = prepare_linear(op, input, values, meta, scale, b, true);
  check_dynamic_linear_colsum_and_k(op, input, colsum, values.size(0),
                                    "values.sum(1, dtype=torch.int32); N from 'values'");
  const int64_t k = input.size(-1);
  if (linear_needs_kernel(out, b, k, kernel != nullptr)) {
    kernel(out, input.reshape({-1, k}).contiguous(), values.contiguous(), meta.contiguous(),
           scale.contiguous(), colsum.contiguous(), contiguous_if_defined(b));
  }
  return out;
}

}  // namespace detail

at::Tensor prune_2_4(const at::Tensor& weight) {
  static auto op = detail::find_op<decltype(prune_2_4)>("fuseops::prune_2_4");
  return op.call(weight);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_2_4(const at::Tensor& weight,
                                                        const std::optional<at::Tensor>& scale) {
  static auto op = detail::find_op<decltype(pack_2_4)>("fuseops::pack_2_4");
  return op.call(weight, detail::none_if_undefined(scale));
}

at::Tensor sparse_2_4_linear(const at::Tensor& input, const at::Tensor& values,
                             const at::Tensor& meta, const at::Tensor& scale,
                             const std::optional<at::Tensor>& bias) {
  constexpr const char* op = "fuseops::sparse_2_4_linear";
  check_floating_input(op, "input", input);
  static auto handle = detail::find_op<decltype(sparse_2_4_linear)>(op);
  return handle.call(input, values, meta, scale, detail::none_if_undefined(bias));
}

at::Tensor sparse_2_4_dynamic_linear(const at::Tensor& input, const at::Tensor& values,
                                     const at::Tensor& meta, const at::Tensor& scale,
                                     const at::Tensor& colsum,
                                     const std::optional<at::Tensor>& bias) {
  constexpr const char* op = "fuseops::sparse_2_4_dynamic_linear";
  check_floating_input(op, "input", input);
  static auto handle = detail::find_op<decltype(sparse_2_4_dynamic_linear)>(op);
  return handle.call(input, values, meta, scale, colsum, detail::none_if_undefined(bias));
}

TORCH_LIBRARY_IMPL(fuseops, CompositeExplicitAutograd, m) {
  m.impl("prune_2_4", TORCH_FN(detail::prune_2_4_impl));
  m.impl("pack_2_4", TORCH_FN(detail::pack_2_4_impl));
}

TORCH_LIBRARY_IMPL(fuseops, Meta, m) {
  // Shapes only: the packing's 2:4 check reads the values.
  m.impl("prune_2_4", TORCH_FN(detail::prune_2_4_meta));
  m.impl("pack_2_4", TORCH_FN(detail::pack_2_4_meta));
}

}  // namespace fuseops
