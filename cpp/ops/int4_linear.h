#pragma once
// The int4 linear family's contract between its shared entry points and its
// kernels (CPU, CUDA, Meta). The packed layout is documented in
// cpp/include/fuseops/int4_linear.h.

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>

#include "ops_generated/int4_linear.h"

namespace fuseops::detail {

// Output channels per packed block.
inline constexpr int64_t kInt4BlockN = 16;

// out [M, N] (contiguous, input's dtype) = input [M, K] (contiguous) times
// the packed weight (contiguous), scale_zero (contiguous [G, 2, N], float32
// or bfloat16) applied per group, plus bias (contiguous [N], input's dtype,
// or undefined). M, N, K > 0; group_size even, G * group_size >= K.
using Int4WeightOnlyLinearKernel = void (*)(const at::Tensor& out, const at::Tensor& input,
                                            const at::Tensor& packed, const at::Tensor& scale_zero,
                                            int64_t group_size, const at::Tensor& bias);

// int4_dynamic_linear's kernel: the same arguments; the input rows are
// quantized to int8 per row inside (group_size a multiple of 2 as above).
using Int4DynamicLinearKernel = Int4WeightOnlyLinearKernel;

at::Tensor int4_weight_only_linear_with(const at::Tensor& input, const at::Tensor& packed,
                                        const at::Tensor& scale_zero, int64_t group_size,
                                        const std::optional<at::Tensor>& bias,
                                        Int4WeightOnlyLinearKernel kernel);

at::Tensor int4_dynamic_linear_with(const at::Tensor& input, const at::Tensor& packed,
                                    const at::Tensor& scale_zero, int64_t group_size,
                                    const std::optional<at::Tensor>& bias,
                                    Int4DynamicLinearKernel kernel);

template <typename Kernels>
struct Int4LinearRegistrations {
  static at::Tensor int4_weight_only_linear(const at::Tensor& input, const at::Tensor& packed,
                                            const at::Tensor& scale_zero, int64_t group_size,
                                            const std::optional<at::Tensor>& bias) {
    return int4_weight_only_linear_with(input, packed, scale_zero, group_size, bias,
                                        Kernels::weight_only());
  }

  static at::Tensor int4_dynamic_linear(const at::Tensor& input, const at::Tensor& packed,
                                        const at::Tensor& scale_zero, int64_t group_size,
                                        const std::optional<at::Tensor>& bias) {
    return int4_dynamic_linear_with(input, packed, scale_zero, group_size, bias,
                                    Kernels::dynamic());
  }

  // The operators of cpp/ops/int4_linear.yaml's `ops:`, each with the function of
  // the same name.
  template <typename Library>
  static void register_all(Library& m) {
    register_int4_linear_kernels<Int4LinearRegistrations>(m);
  }
};

}  // namespace fuseops::detail
