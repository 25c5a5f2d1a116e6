#pragma once
// Internal pieces of the gated activations (swiglu, geglu) shared by their
// backends.

#include <string_view>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "ops/activation.h"
#include "ops/cpu/dispatch.h"

namespace fuseops::detail {

// Kernels see every tensor as a 2-D [rows, H] view whose rows are
// contiguous (stride(1) == 1) but may be any distance apart (stride(0)): the
// two halves of a packed [..., 2*H] tensor are such views, so packed inputs
// and gradients are read and written in place. All views share shape and
// dtype; outputs are allocated.
using GatedKernel = void (*)(const at::Tensor& out, const at::Tensor& gate,
                             const at::Tensor& up, Activation activation);
using GatedBackwardKernel = void (*)(const at::Tensor& grad_gate, const at::Tensor& grad_up,
                                     const at::Tensor& grad_output, const at::Tensor& gate,
                                     const at::Tensor& up, Activation activation);

// Checks, layout and allocation common to every backend (kernel nullptr for
// Meta). `op` names the op in error messages.
at::Tensor gated_with(const char* op, const at::Tensor& gate, const at::Tensor& up,
                      Activation activation, GatedKernel kernel);
at::Tensor& gated_out_with(const char* op, const at::Tensor& gate, const at::Tensor& up,
                           Activation activation, at::Tensor& out, GatedKernel kernel);
std::tuple<at::Tensor, at::Tensor> gated_backward_with(const char* op,
                                                       const at::Tensor& grad_output,
                                                       const at::Tensor& gate,
                                                       const at::Tensor& up,
                                                       Activation activation,
                                                       GatedBackwardKernel kernel);

at::Tensor gated_packed_with(const char* op, const at::Tensor& input, Activation activation,
                             GatedKernel kernel);
at::Tensor& gated_packed_out_with(const char* op, const at::Tensor& input,
                                  Activation activation, at::Tensor& out, GatedKernel kernel);
at::Tensor gated_packed_backward_with(const char* op, const at::Tensor& grad_output,
                                      const at::Tensor& input, Activation activation,
                                      GatedBackwardKernel kernel);

}  // namespace fuseops::detail

namespace fuseops::cpu {
FUSEOPS_DECLARE_CPU_KERNEL(gated_kernel, detail::GatedKernel);
FUSEOPS_DECLARE_CPU_KERNEL(gated_backward_kernel, detail::GatedBackwardKernel);
}  // namespace fuseops::cpu
