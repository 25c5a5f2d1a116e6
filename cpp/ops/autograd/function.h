#pragma once
// What every file of cpp/ops/autograd/ writes its torch::autograd::Functions
// with, named once.

#include <string>

#include <torch/csrc/autograd/custom_function.h>

namespace fuseops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace autograd_detail {

// The GELU form (`approximate`) of gelu, bias_gelu and geglu, kept from the
// forward for the backward ("" for silu and swiglu).
inline void save_approximate(AutogradContext* ctx, const std::string& approximate) {
  ctx->saved_data["approximate"] = approximate;
}
inline std::string saved_approximate(AutogradContext* ctx) {
  return ctx->saved_data["approximate"].toStringRef();
}

}  // namespace autograd_detail

}  // namespace fuseops
