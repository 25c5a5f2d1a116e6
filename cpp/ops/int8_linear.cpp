// fuseops int8 linear layers: the C++ API, the shared checks and the `*_with`
// entry points that every backend's kernels go through; the packing op (ATen
// ops only, one registration for every backend). The schemas and the Meta, CPU
// and CUDA registrations are generated from cpp/ops/int8_linear.yaml. CPU
// kernels: cpp/ops/cpu/int8_linear_kernel.cpp; CUDA:
// cuda/int8_linear_kernel.cu; autograd: none (`autograd:` in
// cpp/ops/int8_linear.yaml declares its refusals).

#include "ops/int8_linear.h"

#include <vector>

#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/sum.h>
#include <torch/library.h>

#include <fuseops/int8_linear.h>

#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/linear_output.h"
#include "ops/common/output_memory.h"
#include "ops/common/tensors.h"

namespace fuseops {
namespace detail {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_int8_weight(const char* op, const at::Tensor& packed, const at::Tensor& scale,
                       const at::Tensor& ref, const char* ref_arg) {
  check_defined(op, "packed", packed);
  check_defined(op, "scale", scale);
  TORCH_CHECK(packed.scalar_type() == at::kChar, op,
              ": argument 'packed' must have dtype int8 (from fuseops.pack_int8_weight), got ",
              packed.scalar_type());
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kInt8BlockN && packed.size(3) == kInt8GroupK,
              op,
              ": argument 'packed' must have shape [ceil(N/16), ceil(K/4), 16, 4] "
              "(from fuseops.pack_int8_weight), got ",
              packed.sizes());
  TORCH_CHECK(scale.scalar_type() == at::kFloat, op,
              ": argument 'scale' must have dtype float32, got ", scale.scalar_type());
  TORCH_CHECK(scale.dim() == 1, op, ": argument 'scale' must be 1-D [N], got shape ",
              scale.sizes());
  const int64_t n = scale.size(0);
  TORCH_CHECK(packed.size(0) == ceil_div(n, kInt8BlockN), op, ": argument 'packed' holds ",
              packed.size(0), " blocks of 16 output channels, but 'scale' has N = ", n,
              " channels (ceil(N/16) = ", ceil_div(n, kInt8BlockN), " blocks)");
  check_same_device(op, "packed", packed, ref_arg, ref);
  check_same_device(op, "scale", scale, ref_arg, ref);
}

// The checks and the output both linear ops share.
at::Tensor prepare_linear(const char* op, const at::Tensor& input, const at::Tensor& packed,
                          const at::Tensor& scale, const at::Tensor& b) {
  check_floating_input(op, "input", input);
  TORCH_CHECK(input.dim() >= 1, op,
              ": argument 'input' must have at least one dimension [..., K], got a 0-d tensor");
  check_int8_weight(op, packed, scale, input, "input");
  const int64_t n = scale.size(0);
  const int64_t k = input.size(-1);
  TORCH_CHECK(packed.size(1) == ceil_div(k, kInt8GroupK), op, ": argument 'input' has K = ", k,
              " (its last dimension), but 'packed' holds ", packed.size(1),
              " groups of 4 input features (K in [", 4 * packed.size(1) - 3, ", ",
              4 * packed.size(1), "]); input shape ", input.sizes());
  return linear_output(op, input, b, n, "scale");
}

}  // namespace

at::Tensor int8_weight_only_linear_with(const at::Tensor& input, const at::Tensor& packed,
                                        const at::Tensor& scale,
                                        const std::optional<at::Tensor>& bias,
                                        Int8WeightOnlyLinearKernel kernel) {
  const at::Tensor b = undefined_if_none(bias);
  at::Tensor out = prepare_linear("fuseops::int8_weight_only_linear", input, packed, scale, b);
  const int64_t k = input.size(-1);
  if (linear_needs_kernel(out, b, k, kernel != nullptr)) {
    kernel(out, input.reshape({-1, k}).contiguous(), packed.contiguous(), scale.contiguous(),
           contiguous_if_defined(b));
  }
  return out;
}

void check_dynamic_linear_colsum_and_k(const char* op, const at::Tensor& input,
                                       const at::Tensor& colsum, int64_t n, const char* from) {
  check_defined(op, "colsum", colsum);
  TORCH_CHECK(colsum.scalar_type() == at::kInt, op, ": argument 'colsum' must have dtype int32 (",
              from, "), got ", colsum.scalar_type());
  TORCH_CHECK(colsum.dim() == 1 && colsum.size(0) == n, op, ": argument 'colsum' must have shape [",
              n, "] (", from, "), got ", colsum.sizes());
  check_same_device(op, "colsum", colsum, "input", input);
  const int64_t k = input.size(-1);
  TORCH_CHECK(k <= kMaxDynamicK, op, ": argument 'input' has K = ", k, " input features; at most ",
              kMaxDynamicK, " are supported (the int32 sums of int8 products could overflow)");
}

at::Tensor int8_dynamic_linear_with(const at::Tensor& input, const at::Tensor& packed,
                                    const at::Tensor& scale, const at::Tensor& colsum,
                                    const std::optional<at::Tensor>& bias,
                                    Int8DynamicLinearKernel kernel) {
  constexpr const char* op = "fuseops::int8_dynamic_linear";
  const at::Tensor b = undefined_if_none(bias);
  at::Tensor out = prepare_linear(op, input, packed, scale, b);
  const int64_t n = scale.size(0);
  const int64_t k = input.size(-1);
  const int64_t blocks = ceil_div(k, kInt8ActivationBlockK);
  check_defined(op, "colsum", colsum);
  TORCH_CHECK(colsum.scalar_type() == at::kShort, op,
              ": argument 'colsum' must have dtype int16 (from fuseops.pack_int8_weight), got ",
              colsum.scalar_type(),
              colsum.dim() == 1 ? " (a per-channel colsum of an older pack_int8_weight: pack "
                                  "the weight again)"
                                : "");
  TORCH_CHECK(colsum.dim() == 2 && colsum.size(0) == blocks && colsum.size(1) == n, op,
              ": argument 'colsum' must have shape [ceil(K/32), N] = [", blocks, ", ", n,
              "] (from fuseops.pack_int8_weight; K from 'input', N from 'scale'), got ",
              colsum.sizes(),
              colsum.dim() == 1 ? " (a per-channel colsum of an older pack_int8_weight: pack "
                                  "the weight again)"
                                : "");
  check_same_device(op, "colsum", colsum, "input", input);
  if (linear_needs_kernel(out, b, k, kernel != nullptr)) {
    kernel(out, input.reshape({-1, k}).contiguous(), packed.contiguous(), scale.contiguous(),
           colsum.contiguous(), contiguous_if_defined(b));
  }
  return out;
}

namespace {

// Every backend: a zero pad, a permutation and a sum, in ATen ops.
std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_int8_weight_impl(const at::Tensor& wq,
                                                                     const at::Tensor& scale) {
  constexpr const char* op = "fuseops::pack_int8_weight";
  check_defined(op, "wq", wq);
  check_defined(op, "scale", scale);
  TORCH_CHECK(wq.scalar_type() == at::kChar, op,
              ": argument 'wq' must have dtype int8 (from fuseops.quantize_per_channel_int8), got ",
              wq.scalar_type());
  TORCH_CHECK(wq.dim() == 2, op, ": argument 'wq' must be 2-D [N, K], got shape ", wq.sizes());
  TORCH_CHECK(scale.scalar_type() == at::kFloat, op,
              ": argument 'scale' must have dtype float32, got ", scale.scalar_type());
  TORCH_CHECK(scale.dim() == 1 && scale.size(0) == wq.size(0), op,
              ": argument 'scale' must have shape [", wq.size(0), "] (N, from 'wq'), got ",
              scale.sizes());
  check_same_device(op, "scale", scale, "wq", wq);
  const int64_t n = wq.size(0);
  const int64_t k = wq.size(1);
  const int64_t blocks = ceil_div(n, kInt8BlockN);
  const int64_t groups = ceil_div(k, kInt8GroupK);
  const at::Tensor padded =
      at::constant_pad_nd(wq, {0, groups * kInt8GroupK - k, 0, blocks * kInt8BlockN - n}, 0);
  at::Tensor packed = empty_output({blocks, groups, kInt8BlockN, kInt8GroupK}, wq.options());
  packed.copy_(padded.view({blocks, kInt8BlockN, groups, kInt8GroupK}).permute({0, 2, 1, 3}));
  at::Tensor scale_copy = empty_output({n}, scale.options());
  scale_copy.copy_(scale);
  // colsum[b, n]: the sum of wq[n, k] over activation block b (zeros past
  // K), so that a block's shifted activation sums can be corrected alone;
  // int16 holds it (|sum| <= 32 * 128), half a bit per weight.
  const int64_t activation_blocks = ceil_div(k, kInt8ActivationBlockK);
  const at::Tensor per_block =
      at::sum(at::constant_pad_nd(wq, {0, activation_blocks * kInt8ActivationBlockK - k}, 0)
                  .view({n, activation_blocks, kInt8ActivationBlockK}),
              {2}, false, at::kInt);
  at::Tensor colsum = empty_output({activation_blocks, n}, wq.options().dtype(at::kShort));
  colsum.copy_(per_block.t());
  return {packed, scale_copy, colsum};
}

}  // namespace
}  // namespace detail

std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_int8_weight(const at::Tensor& wq,
                                                                const at::Tensor& scale) {
  static auto op = detail::find_op<decltype(pack_int8_weight)>("fuseops::pack_int8_weight");
  return op.call(wq, scale);
}

at::Tensor int8_weight_only_linear(const at::Tensor& input, const at::Tensor& packed,
                                   const at::Tensor& scale, const std::optional<at::Tensor>& bias) {
  constexpr const char* op = "fuseops::int8_weight_only_linear";
  check_floating_input(op, "input", input);
  static auto handle =
      detail::find_op<decltype(int8_weight_only_linear)>("fuseops::int8_weight_only_linear");
  return handle.call(input, packed, scale, detail::none_if_undefined(bias));
}

at::Tensor int8_dynamic_linear(const at::Tensor& input, const at::Tensor& packed,
                               const at::Tensor& scale, const at::Tensor& colsum,
                               const std::optional<at::Tensor>& bias) {
  constexpr const char* op = "fuseops::int8_dynamic_linear";
  check_floating_input(op, "input", input);
  static auto handle =
      detail::find_op<decltype(int8_dynamic_linear)>("fuseops::int8_dynamic_linear");
  return handle.call(input, packed, scale, colsum, detail::none_if_undefined(bias));
}

TORCH_LIBRARY_IMPL(fuseops, CompositeExplicitAutograd, m) {
  m.impl("pack_int8_weight", TORCH_FN(detail::pack_int8_weight_impl));
}

}  // namespace fuseops
