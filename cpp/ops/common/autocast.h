#pragma once
// Autocast (torch.autocast) for fuseops ops: each op states, in its
// registration file, how its floating inputs are cast under autocast on CPU
// and on CUDA, mirroring the policy PyTorch gives its own analogous op on that
// device. An op that states nothing falls through (PyTorch's default for ops
// without an autocast kernel): it runs on its inputs as they are.
//
//   FUSEOPS_AUTOCAST(rms_norm, kNone, kFloat32)
//
// Casts apply to the functional overload `<op>` only: an out= or in-place
// overload writes into tensors whose dtype the caller chose, and backward ops
// run on what the forward saved.

#include <torch/library.h>

namespace fuseops::detail {

enum class AutocastCast {
  kNone,            // fall through: no cast (torch's default)
  kLowerPrecision,  // to the autocast dtype, as torch does for conv1d, linear
  kFloat32,         // to float32, as torch does for layer_norm on CUDA
  kPromote,         // to the widest input dtype (float32 if any input is),
                    // as type promotion does for torch's elementwise ops;
                    // an argument named `weight` neither decides nor is
                    // cast (norms take a float32 weight with a reduced
                    // input and keep the input's dtype, as torch's do)
  kFirstInput,      // to the first tensor argument's dtype, as torch's CPU
                    // layer_norm computes a reduced input with float32
                    // parameters and returns the input's dtype
  kLinearLoss,      // a linear layer followed by a loss, as
                    // cross_entropy(linear(input, weight, bias), ...):
                    // `input`, `weight` and `bias` (fused_linear_jsd: the
                    // student's and teacher's input and weight) to the
                    // autocast dtype (the linear's policy), other tensors
                    // as given, and the
                    // floating results returned in float32 (the loss's)
};

// Registers, in `m` (a TORCH_LIBRARY_IMPL block of AutocastCPU or
// AutocastCUDA), the autocast kernel of op `name` for `device`. Tensors that
// are floating, not float64 and on `device` are cast (torch's rule); with
// kNone nothing is registered.
void register_autocast(torch::Library& m, const char* name, c10::DeviceType device,
                       AutocastCast cast);

}  // namespace fuseops::detail

#define FUSEOPS_AUTOCAST(op, cpu_cast, cuda_cast)                                     \
  TORCH_LIBRARY_IMPL(fuseops, AutocastCPU, m) {                                       \
    ::fuseops::detail::register_autocast(m, #op, c10::DeviceType::CPU,                \
                                         ::fuseops::detail::AutocastCast::cpu_cast);  \
  }                                                                                   \
  TORCH_LIBRARY_IMPL(fuseops, AutocastCUDA, m) {                                      \
    ::fuseops::detail::register_autocast(m, #op, c10::DeviceType::CUDA,               \
                                         ::fuseops::detail::AutocastCast::cuda_cast); \
  }
