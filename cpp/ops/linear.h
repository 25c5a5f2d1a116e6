#pragma once
// linear's contract between its shared entry point and its kernels (CPU,
// CUDA, Meta). Semantics: cpp/include/fuseops/linear.h.

#include <optional>

#include <ATen/core/Tensor.h>

#include "ops_generated/linear.h"

namespace fuseops::detail {

// out [M, N], input [M, K], weight [N, K], bias undefined or [N]: one
// dtype, all contiguous; M, N, K > 0.
using LinearKernel = void (*)(const at::Tensor& out, const at::Tensor& input,
                              const at::Tensor& weight, const at::Tensor& bias);

// Whether a CPU product of `rows` rows of `weight`'s dtype runs in float32
// on widened operands (widened_products.h), forward and backward: bfloat16/
// float16 where ATen emulates the type, from kLinearWidenedRows rows (fewer
// rows stream, or cost more to widen than they gain).
bool linear_runs_widened(const at::Tensor& weight, int64_t rows);

at::Tensor linear_with(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, LinearKernel kernel);

template <typename Kernels>
struct LinearRegistrations {
  static at::Tensor linear(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias) {
    return linear_with(input, weight, bias, Kernels::forward());
  }

  // The operators of cpp/ops/linear.yaml's `ops:`, each with the function of
  // the same name.
  template <typename Library>
  static void register_all(Library& m) {
    register_linear_kernels<LinearRegistrations>(m);
  }
};

}  // namespace fuseops::detail
