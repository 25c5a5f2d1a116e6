#pragma once
// The int8 quantization family's contract between its shared entry points
// and its kernels (CPU, CUDA, Meta).

#include <cstdint>
#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "ops_generated/quantize.h"

namespace fuseops::detail {

// Quantizes `rows` contiguous rows of `input` (any floating dtype, at least
// one row) into `q` (int8, same shape) and `scale` (float32, one per row).
// Returns the index of the first row holding Inf or NaN (whose outputs are
// unspecified), or -1 when every row is finite.
using QuantizeRowsKernel = int64_t (*)(const at::Tensor& q, const at::Tensor& scale,
                                       const at::Tensor& input);

// out[o, d, i] = q[o, d, i] * scale[o, i] for contiguous q viewed as
// [outer, size, inner] and scale as [outer, inner]; out is contiguous.
using DequantizeKernel = void (*)(const at::Tensor& out, const at::Tensor& q,
                                  const at::Tensor& scale, int64_t outer, int64_t size,
                                  int64_t inner);

std::tuple<at::Tensor, at::Tensor> quantize_per_channel_int8_with(const at::Tensor& weight,
                                                                  QuantizeRowsKernel kernel);
std::tuple<at::Tensor, at::Tensor> quantize_per_token_int8_with(const at::Tensor& input,
                                                                QuantizeRowsKernel kernel);
at::Tensor dequantize_int8_with(const at::Tensor& q, const at::Tensor& scale, int64_t dim,
                                std::optional<at::ScalarType> dtype, DequantizeKernel kernel);

template <typename Kernels>
struct QuantizeRegistrations {
  static std::tuple<at::Tensor, at::Tensor> quantize_per_channel_int8(const at::Tensor& weight) {
    return quantize_per_channel_int8_with(weight, Kernels::quantize());
  }
  static std::tuple<at::Tensor, at::Tensor> quantize_per_token_int8(const at::Tensor& input) {
    return quantize_per_token_int8_with(input, Kernels::quantize());
  }
  static at::Tensor dequantize_int8(const at::Tensor& q, const at::Tensor& scale, int64_t dim,
                                    std::optional<at::ScalarType> dtype) {
    return dequantize_int8_with(q, scale, dim, dtype, Kernels::dequantize());
  }

  // The operators of cpp/ops/quantize.yaml's `ops:`, each with the function of
  // the same name.
  template <typename Library>
  static void register_all(Library& m) {
    register_quantize_kernels<QuantizeRegistrations>(m);
  }
};

}  // namespace fuseops::detail
