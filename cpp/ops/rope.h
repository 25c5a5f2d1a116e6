#pragma once
// rope's contract between its shared entry points and its kernels (see
// ops/relu.h).

#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "ops_generated/rope.h"

namespace fuseops::detail {

// What a kernel computes. `input`/`out` and `key`/`key_out` are
// [tokens, heads, head_dim] views whose last dimension has stride 1 (other
// strides arbitrary); `out` may be the very view `input` (in place: each
// (token, head) row is read before it is written), likewise `key_out` and
// `key`. cos and sin are contiguous [rows, rotary_dim] in the computation
// dtype (float32, float64 for float64 input); on the CPU also in the input's
// dtype (bfloat16, float16), as the caller passed them. Token t uses row
// positions[t] (int64, contiguous, [tokens]) or, with positions undefined,
// row t. Kernels never see zero tokens.
struct RopeKernelArgs {
  at::Tensor out;
  at::Tensor input;
  at::Tensor key_out;  // undefined for the single-tensor overloads
  at::Tensor key;
  at::Tensor cos;
  at::Tensor sin;
  at::Tensor positions;
  bool interleaved;
  // The backward: the transposed rotation, g * cos + rotate^T(g * sin).
  bool transpose;
};

using RopeKernel = void (*)(const RopeKernelArgs& args);

// Checks, layout and allocation common to every backend; the kernel fills
// the outputs (nullptr for the Meta backend, which only needs shapes).
// `transpose` selects the backward ops (their names in error messages).
std::tuple<at::Tensor, at::Tensor> rope_with(const at::Tensor& query, const at::Tensor& key,
                                             const at::Tensor& cos, const at::Tensor& sin,
                                             const std::optional<at::Tensor>& positions,
                                             bool interleaved, bool transpose, RopeKernel kernel);
void rope_out_with(const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos,
                   const at::Tensor& sin, const std::optional<at::Tensor>& positions,
                   bool interleaved, bool transpose, const at::Tensor& out,
                   const at::Tensor& key_out, RopeKernel kernel);

// The dispatcher entry points of one backend, whose `Kernels::rope()`
// returns its kernel (forward and backward share it).
template <typename Kernels>
struct RopeRegistrations {
  static std::tuple<at::Tensor, at::Tensor> rope(const at::Tensor& query, const at::Tensor& key,
                                                 const at::Tensor& cos, const at::Tensor& sin,
                                                 const std::optional<at::Tensor>& positions,
                                                 bool interleaved) {
    return rope_with(query, key, cos, sin, positions, interleaved, false, Kernels::rope());
  }
  static at::Tensor rope_single(const at::Tensor& input, const at::Tensor& cos,
                                const at::Tensor& sin, const std::optional<at::Tensor>& positions,
                                bool interleaved) {
    return std::get<0>(
        rope_with(input, at::Tensor(), cos, sin, positions, interleaved, false, Kernels::rope()));
  }
  static void rope_out(const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos,
                       const at::Tensor& sin, const std::optional<at::Tensor>& positions,
                       bool interleaved, at::Tensor& out, at::Tensor& key_out) {
    rope_out_with(query, key, cos, sin, positions, interleaved, false, out, key_out,
                  Kernels::rope());
  }
  static void rope_single_out(const at::Tensor& input, const at::Tensor& cos, const at::Tensor& sin,
                              const std::optional<at::Tensor>& positions, bool interleaved,
                              at::Tensor& out) {
    rope_out_with(input, at::Tensor(), cos, sin, positions, interleaved, false, out, at::Tensor(),
                  Kernels::rope());
  }
  static std::tuple<at::Tensor, at::Tensor> rope_backward(
      const at::Tensor& grad_query, const at::Tensor& grad_key, const at::Tensor& cos,
      const at::Tensor& sin, const std::optional<at::Tensor>& positions, bool interleaved) {
    return rope_with(grad_query, grad_key, cos, sin, positions, interleaved, true, Kernels::rope());
  }
  static at::Tensor rope_backward_single(const at::Tensor& grad_input, const at::Tensor& cos,
                                         const at::Tensor& sin,
                                         const std::optional<at::Tensor>& positions,
                                         bool interleaved) {
    return std::get<0>(rope_with(grad_input, at::Tensor(), cos, sin, positions, interleaved, true,
                                 Kernels::rope()));
  }
  static void rope_backward_out(const at::Tensor& grad_query, const at::Tensor& grad_key,
                                const at::Tensor& cos, const at::Tensor& sin,
                                const std::optional<at::Tensor>& positions, bool interleaved,
                                at::Tensor& out, at::Tensor& key_out) {
    rope_out_with(grad_query, grad_key, cos, sin, positions, interleaved, true, out, key_out,
                  Kernels::rope());
  }
  static void rope_backward_single_out(const at::Tensor& grad_input, const at::Tensor& cos,
                                       const at::Tensor& sin,
                                       const std::optional<at::Tensor>& positions, bool interleaved,
                                       at::Tensor& out) {
    rope_out_with(grad_input, at::Tensor(), cos, sin, positions, interleaved, true, out,
                  at::Tensor(), Kernels::rope());
  }

  // The operators of cpp/ops/rope.yaml's `ops:`, each with the function of
  // the same name.
  template <typename Library>
  static void register_all(Library& m) {
    register_rope_kernels<RopeRegistrations>(m);
  }
};

}  // namespace fuseops::detail
