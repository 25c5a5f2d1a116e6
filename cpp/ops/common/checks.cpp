#include "ops/common/checks.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include "ops/common/output_memory.h"

namespace fuseops {

void check_defined(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": argument '", arg,
              "' must be a defined tensor, got an undefined tensor");
}

void check_floating_input(const char* op, const char* arg, const at::Tensor& t) {
  check_defined(op, arg, t);
  const auto dtype = t.scalar_type();
  TORCH_CHECK(
      dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 || dtype == at::kHalf,
      op, ": argument '", arg, "' must have dtype float32, float64, bfloat16 or float16, got ",
      dtype);
}

void check_same_dtype(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                      const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": argument '", arg,
              "' must have the same dtype as '", ref_arg, "' (", ref.scalar_type(), "), got ",
              t.scalar_type());
}

void check_same_device(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                       const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), op, ": argument '", arg,
              "' must be on the same device as '", ref_arg, "' (", ref.device(), "), got ",
              t.device());
}

void check_same_shape(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                      const at::Tensor& ref) {
  TORCH_CHECK(t.sizes() == ref.sizes(), op, ": argument '", arg, "' must have the same shape as '",
              ref_arg, "' ", ref.sizes(), ", got ", t.sizes());
}

void check_out(const char* op, const at::Tensor& out, const char* ref_arg, const at::Tensor& ref,
               const char* out_arg) {
  check_defined(op, out_arg, out);
  check_same_dtype(op, out_arg, out, ref_arg, ref);
  check_same_device(op, out_arg, out, ref_arg, ref);
}

namespace {

// Fake tensors traced with dynamic shapes hold no data and have no concrete
// layout to reason about; functionalization has already removed their
// aliasing.
bool symbolic(const at::Tensor& t) { return t.unsafeGetTensorImpl()->has_symbolic_sizes_strides(); }

// Byte offsets in its storage of the first and one past the last byte `t`
// can address (strides are never negative in PyTorch).
std::pair<int64_t, int64_t> byte_span(const at::Tensor& t) {
  int64_t last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    last += (t.size(d) - 1) * t.stride(d);
  }
  const int64_t item = static_cast<int64_t>(t.itemsize());
  return {t.storage_offset() * item, (last + 1) * item};
}

// Element i of `a` is element i of `b`, for every i.
bool same_elements(const at::Tensor& a, const at::Tensor& b) {
  return a.is_contiguous() && b.is_contiguous() && a.numel() == b.numel() &&
         a.itemsize() == b.itemsize() && a.storage_offset() == b.storage_offset() &&
         a.storage().is_alias_of(b.storage());
}

// A sufficient test that distinct indices address distinct elements: with
// the dimensions sorted by stride, each stride exceeds the furthest offset
// the smaller ones reach. It accepts every layout PyTorch creates without
// as_strided (dense, sliced, transposed, narrowed) and rejects expand().
bool provably_distinct_elements(const at::Tensor& t) {
  if (symbolic(t) || t.numel() <= 1 || t.is_non_overlapping_and_dense()) {
    return true;
  }
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) with size > 1
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) {
      dims.emplace_back(t.stride(d), t.size(d));
    }
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;
  for (const auto& [stride, size] : dims) {
    if (stride <= reach) {
      return false;
    }
    reach += (size - 1) * stride;
  }
  return true;
}

void check_outputs_disjoint(const char* op, std::initializer_list<NamedTensor> outputs) {
  for (auto a = outputs.begin(); a != outputs.end(); ++a) {
    for (auto b = a + 1; b != outputs.end(); ++b) {
      TORCH_CHECK(!share_memory(a->tensor, b->tensor), op, ": arguments '", a->name, "' and '",
                  b->name, "' share memory; each result needs its own tensor, got sizes ",
                  a->tensor.sizes(), " and ", b->tensor.sizes());
    }
  }
}

}  // namespace

bool share_memory(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined() || symbolic(a) || symbolic(b) || a.numel() == 0 ||
      b.numel() == 0 || !a.has_storage() || !b.has_storage() ||
      !a.storage().is_alias_of(b.storage())) {
    return false;
  }
  const auto [a_begin, a_end] = byte_span(a);
  const auto [b_begin, b_end] = byte_span(b);
  return a_begin < b_end && b_begin < a_end;
}

void prepare_outputs(const char* op, std::initializer_list<NamedTensor> outputs,
                     at::IntArrayRef sizes, std::initializer_list<NamedTensor> inputs) {
  check_outputs_disjoint(op, outputs);
  for (const NamedTensor& out : outputs) {
    if (out.tensor.sizes() == sizes) {
      continue;
    }
    for (const NamedTensor& input : inputs) {
      TORCH_CHECK(!input.tensor.defined() || !input.tensor.has_storage() ||
                      !out.tensor.has_storage() ||
                      !out.tensor.storage().is_alias_of(input.tensor.storage()),
                  op, ": argument '", out.name, "' of shape ", out.tensor.sizes(),
                  " must be resized to ", sizes, " but shares memory with argument '", input.name,
                  "', which the resize would change; pass an '", out.name, "' of shape ", sizes,
                  " that does not share memory with '", input.name, "'");
    }
    out.tensor.resize_(sizes);
  }
  check_outputs_disjoint(op, outputs);
  for (const NamedTensor& out : outputs) {
    TORCH_CHECK(provably_distinct_elements(out.tensor), op, ": argument '", out.name,
                "' must not have elements that share memory (as an expand()ed tensor "
                "does), got sizes ",
                out.tensor.sizes(), " and strides ", out.tensor.strides());
  }
}

bool writes_directly(const at::Tensor& out, std::initializer_list<at::Tensor> same_index,
                     std::initializer_list<at::Tensor> inputs) {
  if (!out.is_contiguous()) {
    return false;
  }
  for (const at::Tensor& input : same_index) {
    if (share_memory(out, input) && !same_elements(out, input)) {
      return false;
    }
  }
  for (const at::Tensor& input : inputs) {
    if (share_memory(out, input)) {
      return false;
    }
  }
  return true;
}

void fill_out(const at::Tensor& out, std::initializer_list<at::Tensor> same_index,
              std::initializer_list<at::Tensor> inputs,
              const std::function<void(const at::Tensor&)>& fill) {
  if (writes_directly(out, same_index, inputs)) {
    fill(out);
  } else {
    at::Tensor result = detail::empty_output(out.sizes(), out.options());
    fill(result);
    out.copy_(result);
  }
}

}  // namespace fuseops
