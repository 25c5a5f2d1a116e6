#pragma once
// Small tensor helpers every op shares, one name per idea.

#include <optional>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "ops/common/output_memory.h"

namespace fuseops::detail {

// An absent optional tensor as the undefined tensor kernels and checks take.
inline at::Tensor undefined_if_none(const std::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

// The other way round, for calls whose schema takes `Tensor?`: an undefined
// tensor (or an optional holding one) becomes None.
inline std::optional<at::Tensor> none_if_undefined(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t : std::nullopt;
}

inline at::Tensor contiguous_if_defined(const at::Tensor& t) {
  return t.defined() ? t.contiguous() : t;
}

// Results are contiguous whatever the layout of the tensor they follow, and
// large CPU ones come from the output allocator (output_memory.h).
inline at::Tensor empty_contiguous_like(const at::Tensor& t) {
  return empty_output(t.sizes(), t.options());
}

}  // namespace fuseops::detail
