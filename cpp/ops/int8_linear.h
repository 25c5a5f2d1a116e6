#pragma once
// The int8 linear family's contract between its shared entry points and its
// kernels (CPU, CUDA, Meta). The packed layout is documented in
// cpp/include/fuseops/int8_linear.h.

#include <optional>

#include <ATen/core/Tensor.h>

#include "ops_generated/int8_linear.h"

namespace fuseops::detail {

// Output channels per packed block and K values per group.
inline constexpr int64_t kInt8BlockN = 16;
inline constexpr int64_t kInt8GroupK = 4;
// int8_dynamic_linear's activation blocks: K values per activation scale
// (llama.cpp's Q8_0 block), 8 groups of 4; colsum holds one sum per block
// and channel.
inline constexpr int64_t kInt8ActivationBlockK = 32;

// out [M, N] (contiguous, input's dtype) = input [M, K] (contiguous) times
// the packed weight, scaled per channel, plus bias (contiguous [N], input's
// dtype, or undefined). M, N, K > 0.
using Int8WeightOnlyLinearKernel = void (*)(const at::Tensor& out, const at::Tensor& input,
                                            const at::Tensor& packed, const at::Tensor& scale,
                                            const at::Tensor& bias);

// The largest K sparse_2_4_dynamic_linear takes (its activations are
// quantized per row): |xq * wq| <= 127 * 128, so a sum of K products fits
// in int32 (the kernels' exact accumulator). int8_dynamic_linear sums one
// activation block at a time and has no such limit.
inline constexpr int64_t kMaxDynamicK = (int64_t{1} << 31) / (127 * 128);

// The checks the per-row W8A8 op (2:4) makes of `colsum` (int32 [n], on
// input's device; `from` says where it comes from, for the message) and of
// input's K against kMaxDynamicK.
void check_dynamic_linear_colsum_and_k(const char* op, const at::Tensor& input,
                                       const at::Tensor& colsum, int64_t n, const char* from);

// out [M, N] (contiguous, input's dtype) = input [M, K] (contiguous)
// quantized per activation block of 32 along K, times the packed weight
// (colsum: contiguous int16 [ceil(K/32), N], each block's sums), each
// block's sums scaled by the block's activation scale, the total by the
// channel's, plus bias as above. M, N, K > 0.
using Int8DynamicLinearKernel = void (*)(const at::Tensor& out, const at::Tensor& input,
                                         const at::Tensor& packed, const at::Tensor& scale,
                                         const at::Tensor& colsum, const at::Tensor& bias);

at::Tensor int8_dynamic_linear_with(const at::Tensor& input, const at::Tensor& packed,
                                    const at::Tensor& scale, const at::Tensor& colsum,
                                    const std::optional<at::Tensor>& bias,
                                    Int8DynamicLinearKernel kernel);

at::Tensor int8_weight_only_linear_with(const at::Tensor& input, const at::Tensor& packed,
                                        const at::Tensor& scale,
                                        const std::optional<at::Tensor>& bias,
                                        Int8WeightOnlyLinearKernel kernel);

template <typename Kernels>
struct Int8LinearRegistrations {
  static at::Tensor int8_weight_only_linear(const at::Tensor& input, const at::Tensor& packed,
                                            const at::Tensor& scale,
                                            const std::optional<at::Tensor>& bias) {
    return int8_weight_only_linear_with(input, packed, scale, bias, Kernels::weight_only());
  }

  static at::Tensor int8_dynamic_linear(const at::Tensor& input, const at::Tensor& packed,
                                        const at::Tensor& scale, const at::Tensor& colsum,
                                        const std::optional<at::Tensor>& bias) {
    return int8_dynamic_linear_with(input, packed, scale, colsum, bias, Kernels::dynamic());
  }

  // The operators of cpp/ops/int8_linear.yaml's `ops:`, each with the function of
  // the same name.
  template <typename Library>
  static void register_all(Library& m) {
    register_int8_linear_kernels<Int8LinearRegistrations>(m);
  }
};

}  // namespace fuseops::detail
