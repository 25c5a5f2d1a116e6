#pragma once
// The int4 linear family's contract between its shared entry points and its
// kernels (CPU, CUDA, Meta). The packed layout is documented in
// cpp/include/fuseops/int4_linear.h.

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/CompileTimeFunctionPointer.h>

namespace fuseops::detail {

// Output channels per packed block.
inline constexpr int64_t kInt4BlockN = 16;

// out [M, N] (contiguous, input's dtype) = input [M, K] (contiguous) times
// the packed weight (contiguous), scale_zero (contiguous float32 [G, 2, N])
// applied per group, plus bias (contiguous [N], input's dtype, or
// undefined). M, N, K > 0; group_size even, G * group_size >= K.
using Int4WeightOnlyLinearKernel = void (*)(const at::Tensor& out, const at::Tensor& input,
                                            const at::Tensor& packed,
                                            const at::Tensor& scale_zero, int64_t group_size,
                                            const at::Tensor& bias);

at::Tensor int4_weight_only_linear_with(const at::Tensor& input, const at::Tensor& packed,
                                        const at::Tensor& scale_zero, int64_t group_size,
                                        const std::optional<at::Tensor>& bias,
                                        Int4WeightOnlyLinearKernel kernel);

template <typename Kernels>
struct Int4LinearRegistrations {
  static at::Tensor int4_weight_only_linear(const at::Tensor& input, const at::Tensor& packed,
                                            const at::Tensor& scale_zero, int64_t group_size,
                                            const std::optional<at::Tensor>& bias) {
    return int4_weight_only_linear_with(input, packed, scale_zero, group_size, bias,
                                        Kernels::weight_only());
  }

  template <typename Library>
  static void register_all(Library& m) {
    m.impl("int4_weight_only_linear", TORCH_FN(int4_weight_only_linear));
  }
};

}  // namespace fuseops::detail
