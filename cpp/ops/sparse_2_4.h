#pragma once
// The 2:4 sparse linear family's contract between its shared entry point
// and its kernels (CPU, CUDA, Meta). The packed layout is documented in
// cpp/include/fuseops/sparse_2_4.h.

#include <optional>

#include <ATen/core/Tensor.h>

#include "ops_generated/sparse_2_4.h"

namespace fuseops::detail {

// K values per group, of which at most 2 are kept.
inline constexpr int64_t kSparseGroupK = 4;

// out [M, N] (contiguous, input's dtype) = input [M, K] (contiguous) times
// the packed weight (values [N, K/2], meta [N, ceil(K/8)], contiguous),
// scaled per channel (scale: contiguous float32 [N]), plus bias
// (contiguous [N], input's dtype, or undefined). M, N, K > 0.
using Sparse24LinearKernel = void (*)(const at::Tensor& out, const at::Tensor& input,
                                      const at::Tensor& values, const at::Tensor& meta,
                                      const at::Tensor& scale, const at::Tensor& bias);

// out [M, N] (contiguous, input's dtype) = input [M, K] (contiguous)
// quantized per row, times the packed int8 weight (values, meta as above;
// colsum: contiguous int32 [N], each channel's sum of values), scaled per
// row and channel, plus bias as above. M, N, K > 0, K <= kMaxDynamicK.
using Sparse24DynamicLinearKernel = void (*)(const at::Tensor& out, const at::Tensor& input,
                                             const at::Tensor& values, const at::Tensor& meta,
                                             const at::Tensor& scale, const at::Tensor& colsum,
                                             const at::Tensor& bias);

at::Tensor sparse_2_4_linear_with(const at::Tensor& input, const at::Tensor& values,
                                  const at::Tensor& meta, const at::Tensor& scale,
                                  const std::optional<at::Tensor>& bias,
                                  Sparse24LinearKernel kernel);

at::Tensor sparse_2_4_dynamic_linear_with(const at::Tensor& input, const at::Tensor& values,
                                          const at::Tensor& meta, const at::Tensor& scale,
                                          const at::Tensor& colsum,
                                          const std::optional<at::Tensor>& bias,
                                          Sparse24DynamicLinearKernel kernel);

template <typename Kernels>
struct Sparse24Registrations {
  static at::Tensor sparse_2_4_linear(const at::Tensor& input, const at::Tensor& values,
                                      const at::Tensor& meta, const at::Tensor& scale,
                                      const std::optional<at::Tensor>& bias) {
    return sparse_2_4_linear_with(input, values, meta, scale, bias, Kernels::linear());
  }

  static at::Tensor sparse_2_4_dynamic_linear(const at::Tensor& input, const at::Tensor& values,
                                              const at::Tensor& meta, const at::Tensor& scale,
                                              const at::Tensor& colsum,
                                              const std::optional<at::Tensor>& bias) {
    return sparse_2_4_dynamic_linear_with(input, values, meta, scale, colsum, bias,
                                          Kernels::dynamic());
  }

  // The operators of cpp/ops/sparse_2_4.yaml's `ops:`, each with the function of
  // the same name.
  template <typename Library>
  static void register_all(Library& m) {
    register_sparse_2_4_kernels<Sparse24Registrations>(m);
  }
};

}  // namespace fuseops::detail
