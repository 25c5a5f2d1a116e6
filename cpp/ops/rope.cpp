// fuseops::rope: the C++ API, the shared checks and the `*_with` entry points
// that every backend's kernels go through. The schemas and the Meta, CPU and
// CUDA registrations are generated from cpp/ops/rope.yaml. CPU kernels:
// cpp/ops/cpu/rope_kernel.cpp; CUDA: cuda/rope_kernel.cu; autograd:
// cpp/ops/autograd/rope.cpp.

#include "ops/rope.h"

#include <algorithm>
#include <vector>

#include <ATen/ExpandUtils.h>
#include <ATen/OpMathType.h>
#include <ATen/TensorUtils.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/index_select.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include <fuseops/rope.h>

#include "ops/common/checks.h"
#include "ops/common/dispatcher.h"
#include "ops/common/tensors.h"

namespace fuseops {
namespace detail {
namespace {

// The names one call uses in its error messages.
struct Names {
  const char* op;
  const char* input;
  const char* key;
};

Names names(bool has_key, bool transpose, bool out) {
  if (out && transpose) {
    return has_key ? Names{"fuseops::rope_backward.out", "grad_query", "grad_key"}
                   : Names{"fuseops::rope_backward.single_out", "grad_input", "grad_key"};
  }
  if (out) {
    return has_key ? Names{"fuseops::rope.out", "query", "key"}
                   : Names{"fuseops::rope.single_out", "input", "key"};
  }
  if (transpose) {
    return has_key ? Names{"fuseops::rope_backward", "grad_query", "grad_key"}
                   : Names{"fuseops::rope_backward.single", "grad_input", "grad_key"};
  }
  return has_key ? Names{"fuseops::rope", "query", "key"}
                 : Names{"fuseops::rope.single", "input", "key"};
}

// A tensor's token dimensions: all but (heads, head_dim).
at::IntArrayRef token_dims(const at::Tensor& t) { return t.sizes().slice(0, t.dim() - 2); }

void check_input(const Names& n, const at::Tensor& input) {
  check_floating_input(n.op, n.input, input);
  TORCH_CHECK(input.dim() >= 2, n.op, ": argument '", n.input,
              "' must have shape [..., heads, head_dim] (at least 2 dimensions), got ",
              input.sizes());
}

void check_key(const Names& n, const at::Tensor& input, const at::Tensor& key) {
  check_floating_input(n.op, n.key, key);
  check_same_dtype(n.op, n.key, key, n.input, input);
  check_same_device(n.op, n.key, key, n.input, input);
  TORCH_CHECK(key.dim() == input.dim() && token_dims(key) == token_dims(input) &&
                  key.size(-1) == input.size(-1),
              n.op, ": argument '", n.key, "' must have shape [",
              c10::Join(", ", token_dims(input)), token_dims(input).empty() ? "" : ", ",
              "kv_heads, ", input.size(-1), "] (the token dimensions and head_dim of '", n.input,
              "' ", input.sizes(), ", any number of heads), got ", key.sizes());
}

// cos and sin: same dtype, device and shape; an even rotary dim (their last
// dimension) of at most head_dim. Returns the rotary dim.
int64_t check_cache(const Names& n, const at::Tensor& input, const at::Tensor& cos,
                    const at::Tensor& sin) {
  check_floating_input(n.op, "cos", cos);
  check_floating_input(n.op, "sin", sin);
  check_same_device(n.op, "cos", cos, n.input, input);
  check_same_device(n.op, "sin", sin, n.input, input);
  check_same_dtype(n.op, "sin", sin, "cos", cos);
  check_same_shape(n.op, "sin", sin, "cos", cos);
  TORCH_CHECK(cos.dim() >= 1, n.op,
              ": argument 'cos' must have shape [max_pos, rotary_dim] (with positions) or "
              "[..., rotary_dim] (per token), got a 0-dimensional tensor");
  const int64_t rotary_dim = cos.size(-1);
  TORCH_CHECK(rotary_dim % 2 == 0 && rotary_dim <= input.size(-1), n.op,
              ": the rotary dim (the last dimension of 'cos' and 'sin') must be even and at "
              "most head_dim (",
              input.size(-1), ", the last dimension of '", n.input, "'), got ", rotary_dim);
  return rotary_dim;
}

// [tokens, heads, head_dim] with stride 1 along head_dim: a view where the
// layout allows one (views of a fused qkv tensor are read in place), else a
// contiguous copy.
at::Tensor as_rows(const at::Tensor& t, int64_t tokens) {
  const at::Tensor inner = t.size(-1) > 1 && t.stride(-1) != 1 ? t.contiguous() : t;
  return inner.reshape({tokens, t.size(-2), t.size(-1)});
}

// Whether `t` (stride 1 along head_dim or not) can be written by a kernel as
// a [tokens, heads, head_dim] view without a copy.
bool kernel_writable(const at::Tensor& t, int64_t tokens) {
  if (t.size(-1) > 1 && t.stride(-1) != 1) {
    return false;
  }
  const std::vector<int64_t> rows{tokens, t.size(-2), t.size(-1)};
  return at::detail::computeStride(t.sizes(), t.strides(), rows).has_value();
}

// A [tokens, heads, head_dim] view whose rows of one token are adjacent in
// memory: runs of `width` elements starting `stride` apart.
struct RowRuns {
  int64_t offset, count, stride, width;
};

std::optional<RowRuns> row_runs(const at::Tensor& t) {
  const int64_t head_dim = t.size(2);
  if (t.stride(2) != 1 && head_dim > 1) {
    return std::nullopt;
  }
  if (t.size(1) > 1 && t.stride(1) != head_dim) {
    return std::nullopt;
  }
  const int64_t width = t.size(1) * head_dim;
  const int64_t stride = t.size(0) > 1 ? t.stride(0) : width;
  if (stride < width) {
    return std::nullopt;
  }
  return RowRuns{t.storage_offset(), t.size(0), stride, width};
}

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// Whether two [tokens, heads, head_dim] views may share an element:
// share_memory() (checks.h), refined to be exact for views made of runs
// with one stride (slices of one fused qkv projection: q, k and v each take
// a column range of every row, so their byte ranges interleave).
bool may_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (!share_memory(a, b)) {
    return false;
  }
  if (a.dim() != 3 || b.dim() != 3 || a.itemsize() != b.itemsize()) {
    return true;
  }
  const auto ra = row_runs(a);
  const auto rb = row_runs(b);
  if (!ra || !rb) {
    return true;
  }
  const int64_t stride = ra->count > 1 ? ra->stride : rb->stride;
  if ((ra->count > 1 && ra->stride != stride) || (rb->count > 1 && rb->stride != stride)) {
    return true;
  }
  // Run t of a is [t*S, t*S + Wa) (relative to a's offset), run u of b is
  // [d + u*S, d + u*S + Wb): they meet iff -Wb < d + m*S < Wa for m = u - t
  // in [-(Ta - 1), Tb - 1].
  const int64_t d = rb->offset - ra->offset;
  const int64_t m_low = std::max(floor_div(-rb->width - d, stride) + 1, -(ra->count - 1));
  const int64_t m_high = std::min(floor_div(ra->width - d - 1, stride), rb->count - 1);
  return m_low <= m_high;
}

bool same_view(const at::Tensor& a, const at::Tensor& b) {
  return a.has_storage() && b.has_storage() && a.storage().is_alias_of(b.storage()) &&
         a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && a.scalar_type() == b.scalar_type();
}

// What the kernels read besides query and key.
struct Tables {
  at::Tensor cos, sin, positions;
};

// Positions outside the cache are refused before anything is written. On
// CPU this is checked here; a CUDA kernel checks each position it reads
// (cuda/rope_kernel.cu) and never reads outside the cache.
void check_positions_in_range(const Names& n, const at::Tensor& positions, int64_t max_pos) {
  if (!positions.is_cpu() || positions.numel() == 0) {
    return;
  }
  const auto [low, high] = at::aminmax(positions);
  const int64_t lowest = low.item<int64_t>();
  const int64_t highest = high.item<int64_t>();
  TORCH_CHECK(lowest >= 0 && highest < max_pos, n.op,
              ": argument 'positions' must hold rows of the cos/sin cache, in [0, ", max_pos,
              "), got values from ", lowest, " to ", highest);
}

Tables prepare_tables(const Names& n, const at::Tensor& input, const at::Tensor& cos,
                      const at::Tensor& sin, const std::optional<at::Tensor>& positions_opt,
                      int64_t rotary_dim, int64_t tokens, bool compute) {
  const at::IntArrayRef lead = token_dims(input);
  // The tables' dtype: the computation dtype; on the CPU a table of the
  // input's own dtype too, which its kernel widens as it loads it (the same
  // values), so that a call converts nothing: a decode step's rope, one token,
  // spent more on converting its cos/sin rows than on rotating.
  const at::ScalarType table_dtype =
      input.device().is_cpu() && cos.scalar_type() == input.scalar_type()
          ? input.scalar_type()
          : at::toOpMathType(input.scalar_type());
  const at::Tensor positions = undefined_if_none(positions_opt);
  Tables tables;
  if (positions.defined()) {
    TORCH_CHECK(positions.scalar_type() == at::kLong || positions.scalar_type() == at::kInt, n.op,
                ": argument 'positions' must have dtype int64 or int32, got ",
                positions.scalar_type());
    check_same_device(n.op, "positions", positions, n.input, input);
    TORCH_CHECK(at::is_expandable_to(positions.sizes(), lead), n.op,
                ": argument 'positions' must have a shape broadcastable to the token "
                "dimensions of '",
                n.input, "' ", lead, ", got ", positions.sizes());
    TORCH_CHECK(cos.dim() == 2, n.op,
                ": with positions, 'cos' and 'sin' must be caches of shape [max_pos, "
                "rotary_dim], got ",
                cos.sizes());
    if (!compute) {
      return tables;
    }
    tables.positions = positions.expand(lead).reshape({tokens}).to(at::kLong).contiguous();
    check_positions_in_range(n, tables.positions, cos.size(0));
    if (cos.scalar_type() == table_dtype) {
      tables.cos = cos.contiguous();
      tables.sin = sin.contiguous();
    } else {
      // Only the rows used are converted, not the whole cache.
      tables.cos = cos.index_select(0, tables.positions).to(table_dtype).contiguous();
      tables.sin = sin.index_select(0, tables.positions).to(table_dtype).contiguous();
      tables.positions = at::Tensor();
    }
    return tables;
  }
  std::vector<int64_t> per_token(lead.begin(), lead.end());
  per_token.push_back(rotary_dim);
  TORCH_CHECK(at::is_expandable_to(cos.sizes(), per_token), n.op,
              ": without positions, 'cos' and 'sin' hold one row per token and must have a "
              "shape broadcastable to ",
              at::IntArrayRef(per_token), " (the token dimensions of '", n.input,
              "', then the rotary dim), got ", cos.sizes());
  if (compute) {
    tables.cos = cos.expand(per_token).reshape({tokens, rotary_dim}).to(table_dtype).contiguous();
    tables.sin = sin.expand(per_token).reshape({tokens, rotary_dim}).to(table_dtype).contiguous();
  }
  return tables;
}

struct Checked {
  Names names;
  int64_t rotary_dim;
  int64_t tokens;
};

Checked check_all(const Names& n, const at::Tensor& input, const at::Tensor& key,
                  const at::Tensor& cos, const at::Tensor& sin) {
  check_input(n, input);
  if (key.defined()) {
    check_key(n, input, key);
  }
  const int64_t rotary_dim = check_cache(n, input, cos, sin);
  return {n, rotary_dim, c10::multiply_integers(token_dims(input))};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rope_with(const at::Tensor& query, const at::Tensor& key,
                                             const at::Tensor& cos, const at::Tensor& sin,
                                             const std::optional<at::Tensor>& positions,
                                             bool interleaved, bool transpose, RopeKernel kernel) {
  const Checked c = check_all(names(key.defined(), transpose, false), query, key, cos, sin);
  at::Tensor out = empty_contiguous_like(query);
  at::Tensor key_out = key.defined() ? empty_contiguous_like(key) : at::Tensor();
  const bool compute = kernel != nullptr && c.tokens > 0;
  const Tables tables =
      prepare_tables(c.names, query, cos, sin, positions, c.rotary_dim, c.tokens, compute);
  if (compute) {
    kernel({as_rows(out, c.tokens), as_rows(query, c.tokens),
            key.defined() ? as_rows(key_out, c.tokens) : at::Tensor(),
            key.defined() ? as_rows(key, c.tokens) : at::Tensor(), tables.cos, tables.sin,
            tables.positions, interleaved, transpose});
  }
  return {out, key_out};
}

void rope_out_with(const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos,
                   const at::Tensor& sin, const std::optional<at::Tensor>& positions_opt,
                   bool interleaved, bool transpose, const at::Tensor& out,
                   const at::Tensor& key_out, RopeKernel kernel) {
  const Checked c = check_all(names(key.defined(), transpose, true), query, key, cos, sin);
  const char* op = c.names.op;
  const at::Tensor positions = undefined_if_none(positions_opt);
  check_out(op, out, c.names.input, query);
  if (key.defined()) {
    check_defined(op, "key_out", key_out);
    check_same_dtype(op, "key_out", key_out, c.names.key, key);
    check_same_device(op, "key_out", key_out, c.names.key, key);
  }
  const std::initializer_list<NamedTensor> inputs = {{c.names.input, query},
                                                     {c.names.key, key},
                                                     {"cos", cos},
                                                     {"sin", sin},
                                                     {"positions", positions}};
  prepare_outputs(op, {{"out", out}}, query.sizes(), inputs);
  if (key.defined()) {
    prepare_outputs(op, {{"key_out", key_out}}, key.sizes(), inputs);
  }
  const bool compute = kernel != nullptr && c.tokens > 0;
  if (key.defined() && c.tokens > 0) {
    // prepare_outputs' test of two outputs is conservative; this one is
    // exact for q and k taken from one fused qkv tensor, the in-place case.
    const bool viewable = kernel_writable(out, c.tokens) && kernel_writable(key_out, c.tokens);
    TORCH_CHECK(
        !(viewable ? may_overlap(out.reshape({c.tokens, out.size(-2), out.size(-1)}),
                                 key_out.reshape({c.tokens, key_out.size(-2), key_out.size(-1)}))
                   : may_overlap(out, key_out)),
        op,
        ": arguments 'out' and 'key_out' share memory; each result needs its own "
        "tensor, got sizes ",
        out.sizes(), " and ", key_out.sizes());
  }
  const Tables tables =
      prepare_tables(c.names, query, cos, sin, positions, c.rotary_dim, c.tokens, compute);
  if (!compute) {
    return;
  }
  const at::Tensor q_rows = as_rows(query, c.tokens);
  const at::Tensor k_rows = key.defined() ? as_rows(key, c.tokens) : at::Tensor();
  // An output is written directly when the kernel can write its layout and
  // it is either exactly the view the kernel reads for its own input (in
  // place: each row is read before it is written) or disjoint from every
  // tensor the kernel reads; otherwise through a temporary.
  auto target = [&](const at::Tensor& o, const at::Tensor& own, const at::Tensor& other) {
    if (!kernel_writable(o, c.tokens)) {
      return at::Tensor();
    }
    at::Tensor rows = o.reshape({c.tokens, o.size(-2), o.size(-1)});
    const bool clear = (same_view(rows, own) || !may_overlap(rows, own)) &&
                       !may_overlap(rows, other) && !may_overlap(rows, tables.cos) &&
                       !may_overlap(rows, tables.sin) && !may_overlap(rows, tables.positions);
    return clear ? rows : at::Tensor();
  };
  at::Tensor q_target = target(out, q_rows, k_rows);
  at::Tensor k_target = key.defined() ? target(key_out, k_rows, q_rows) : at::Tensor();
  const bool q_direct = q_target.defined();
  const bool k_direct = !key.defined() || k_target.defined();
  if (!q_direct) {
    q_target = empty_output({c.tokens, query.size(-2), query.size(-1)}, query.options());
  }
  if (!k_direct) {
    k_target = empty_output({c.tokens, key.size(-2), key.size(-1)}, key.options());
  }
  kernel({q_target, q_rows, k_target, k_rows, tables.cos, tables.sin, tables.positions, interleaved,
          transpose});
  if (!q_direct) {
    out.copy_(q_target.view(query.sizes()));
  }
  if (!k_direct) {
    key_out.copy_(k_target.view(key.sizes()));
  }
}

}  // namespace detail

// C++ API: through the dispatcher, so autograd and the device kernels apply.
// Undefined tensors carry no dispatch key, so they are rejected here, before
// the dispatcher would fail with a message that names no argument.
using detail::find_op;
using detail::find_out_op;

namespace {

void check_defined(const char* op,
                   std::initializer_list<std::pair<const char*, const at::Tensor*>> tensors) {
  for (const auto& [name, t] : tensors) {
    check_floating_input(op, name, *t);
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rope(const at::Tensor& query, const at::Tensor& key,
                                        const at::Tensor& cos, const at::Tensor& sin,
                                        const std::optional<at::Tensor>& positions,
                                        bool interleaved) {
  check_defined("fuseops::rope", {{"query", &query}, {"key", &key}, {"cos", &cos}, {"sin", &sin}});
  static auto op = find_op<decltype(rope)>("fuseops::rope");
  return op.call(query, key, cos, sin, detail::none_if_undefined(positions), interleaved);
}

at::Tensor rope_single(const at::Tensor& input, const at::Tensor& cos, const at::Tensor& sin,
                       const std::optional<at::Tensor>& positions, bool interleaved) {
  check_defined("fuseops::rope.single", {{"input", &input}, {"cos", &cos}, {"sin", &sin}});
  static auto op = find_op<decltype(rope_single)>("fuseops::rope", "single");
  return op.call(input, cos, sin, detail::none_if_undefined(positions), interleaved);
}

std::tuple<at::Tensor&, at::Tensor&> rope_out(const at::Tensor& query, const at::Tensor& key,
                                              const at::Tensor& cos, const at::Tensor& sin,
                                              const std::optional<at::Tensor>& positions,
                                              bool interleaved, at::Tensor& out,
                                              at::Tensor& key_out) {
  constexpr const char* name = "fuseops::rope.out";
  check_defined(name, {{"query", &query}, {"key", &key}, {"cos", &cos}, {"sin", &sin}});
  check_out(name, out, "query", query);
  static auto op = find_out_op<decltype(rope_out)>("fuseops::rope", "out");
  op.call(query, key, cos, sin, detail::none_if_undefined(positions), interleaved, out, key_out);
  return {out, key_out};
}

at::Tensor& rope_single_out(const at::Tensor& input, const at::Tensor& cos, const at::Tensor& sin,
                            const std::optional<at::Tensor>& positions, bool interleaved,
                            at::Tensor& out) {
  constexpr const char* name = "fuseops::rope.single_out";
  check_defined(name, {{"input", &input}, {"cos", &cos}, {"sin", &sin}});
  check_out(name, out, "input", input);
  static auto op = find_out_op<decltype(rope_single_out)>("fuseops::rope", "single_out");
  op.call(input, cos, sin, detail::none_if_undefined(positions), interleaved, out);
  return out;
}

std::tuple<at::Tensor&, at::Tensor&> rope_(at::Tensor& query, at::Tensor& key,
                                           const at::Tensor& cos, const at::Tensor& sin,
                                           const std::optional<at::Tensor>& positions,
                                           bool interleaved) {
  return rope_out(query, key, cos, sin, positions, interleaved, query, key);
}

std::tuple<at::Tensor, at::Tensor> rope_backward(const at::Tensor& grad_query,
                                                 const at::Tensor& grad_key, const at::Tensor& cos,
                                                 const at::Tensor& sin,
                                                 const std::optional<at::Tensor>& positions,
                                                 bool interleaved) {
  check_defined(
      "fuseops::rope_backward",
      {{"grad_query", &grad_query}, {"grad_key", &grad_key}, {"cos", &cos}, {"sin", &sin}});
  static auto op = find_op<decltype(rope_backward)>("fuseops::rope_backward");
  return op.call(grad_query, grad_key, cos, sin, detail::none_if_undefined(positions), interleaved);
}

at::Tensor rope_single_backward(const at::Tensor& grad_input, const at::Tensor& cos,
                                const at::Tensor& sin, const std::optional<at::Tensor>& positions,
                                bool interleaved) {
  check_defined("fuseops::rope_backward.single",
                {{"grad_input", &grad_input}, {"cos", &cos}, {"sin", &sin}});
  static auto op = find_op<decltype(rope_single_backward)>("fuseops::rope_backward", "single");
  return op.call(grad_input, cos, sin, detail::none_if_undefined(positions), interleaved);
}

std::tuple<at::Tensor&, at::Tensor&> rope_backward_out(const at::Tensor& grad_query,
                                                       const at::Tensor& grad_key,
                                                       const at::Tensor& cos, const at::Tensor& sin,
                                                       const std::optional<at::Tensor>& positions,
                                                       bool interleaved, at::Tensor& out,
                                                       at::Tensor& key_out) {
  constexpr const char* name = "fuseops::rope_backward.out";
  check_defined(
      name, {{"grad_query", &grad_query}, {"grad_key", &grad_key}, {"cos", &cos}, {"sin", &sin}});
  check_out(name, out, "grad_query", grad_query);
  static auto op = find_out_op<decltype(rope_backward_out)>("fuseops::rope_backward", "out");
  op.call(grad_query, grad_key, cos, sin, detail::none_if_undefined(positions), interleaved, out,
          key_out);
  return {out, key_out};
}

at::Tensor& rope_backward_single_out(const at::Tensor& grad_input, const at::Tensor& cos,
                                     const at::Tensor& sin,
                                     const std::optional<at::Tensor>& positions, bool interleaved,
                                     at::Tensor& out) {
  constexpr const char* name = "fuseops::rope_backward.single_out";
  check_defined(name, {{"grad_input", &grad_input}, {"cos", &cos}, {"sin", &sin}});
  check_out(name, out, "grad_input", grad_input);
  static auto op =
      find_out_op<decltype(rope_backward_single_out)>("fuseops::rope_backward", "single_out");
  op.call(grad_input, cos, sin, detail::none_if_undefined(positions), interleaved, out);
  return out;
}

}  // namespace fuseops
