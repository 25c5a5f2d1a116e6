// Autograd for fuseops::rope, registered in C++ so LibTorch programs get
// gradients without Python. rope is linear in query and key: its backward is
// the transposed rotation (rope_backward), whose own derivative is rope
// again, so double backward is two more calls of the same kernel. cos, sin
// and positions are not differentiable: a call that would record a gradient
// for cos or sin is refused rather than leaving their .grad silently None.
// Function::apply fails on an undefined tensor with a message naming
// nothing, so each kernel checks its tensors first.

#include <optional>
#include <tuple>
#include <utility>

#include <torch/library.h>

#include <fuseops/rope.h>

#include "ops/autograd/function.h"
#include "ops/autograd/no_derivative.h"
#include "ops/autograd/reusable_gradient.h"
#include "ops/common/checks.h"
#include "ops/common/tensors.h"
#include "ops_generated/autograd/rope.h"

namespace fuseops {
namespace {

void check_tables_not_differentiated(const char* op, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(!autograd_detail::records_grad({cos, sin}), op,
              ": arguments 'cos' and 'sin' are not differentiable (fuseops computes no "
              "gradient for the cos/sin cache), got a tensor that requires grad; build the "
              "cache under torch.no_grad() or pass cos.detach() and sin.detach()");
}

void save_tables(AutogradContext* ctx, const at::Tensor& cos, const at::Tensor& sin,
                 const std::optional<at::Tensor>& positions, bool interleaved) {
  ctx->save_for_backward({cos, sin, detail::undefined_if_none(positions)});
  ctx->saved_data["interleaved"] = interleaved;
  ctx->set_materialize_grads(false);
}

struct Tables {
  at::Tensor cos, sin;
  std::optional<at::Tensor> positions;
  bool interleaved;
};

Tables saved_tables(AutogradContext* ctx) {
  const auto saved = ctx->get_saved_variables();
  return {saved[0], saved[1], detail::none_if_undefined(saved[2]),
          ctx->saved_data["interleaved"].toBool()};
}

// The rotation (transpose=false) or its transpose of whichever of (a, b)
// are defined, through the differentiable dispatcher ops.
std::tuple<at::Tensor, at::Tensor> apply(bool transpose, const at::Tensor& a, const at::Tensor& b,
                                         const Tables& t) {
  if (a.defined() && b.defined()) {
    return transpose ? fuseops::rope_backward(a, b, t.cos, t.sin, t.positions, t.interleaved)
                     : fuseops::rope(a, b, t.cos, t.sin, t.positions, t.interleaved);
  }
  auto single = [&](const at::Tensor& x) {
    if (!x.defined()) {
      return at::Tensor();
    }
    return transpose ? fuseops::rope_single_backward(x, t.cos, t.sin, t.positions, t.interleaved)
                     : fuseops::rope_single(x, t.cos, t.sin, t.positions, t.interleaved);
  };
  return {single(a), single(b)};
}

// rope's backward of one gradient (undefined stays undefined), written over
// it when nothing else refers to it.
at::Tensor rotate_over(at::Tensor& slot, const Tables& t) {
  return autograd_detail::gradient_over(
      slot, at::Tensor(),
      [&](at::Tensor& grad) {
        fuseops::rope_backward_single_out(grad, t.cos, t.sin, t.positions, t.interleaved, grad);
      },
      [&](const at::Tensor& grad) { return std::get<0>(apply(true, grad, at::Tensor(), t)); });
}

// rope's backward of both gradients in one call, each written over its own
// gradient when nothing else refers to it, else into a new tensor.
std::tuple<at::Tensor, at::Tensor> rotate_pair_over(at::Tensor& query_slot, at::Tensor& key_slot,
                                                    const Tables& t) {
  at::Tensor grad_query = std::move(query_slot);
  at::Tensor grad_key = std::move(key_slot);
  const bool query_reused = autograd_detail::reusable_gradient(grad_query, at::Tensor());
  const bool key_reused = autograd_detail::reusable_gradient(grad_key, at::Tensor());
  if (!query_reused && !key_reused) {
    return apply(true, grad_query, grad_key, t);
  }
  at::Tensor out = query_reused ? grad_query : detail::empty_contiguous_like(grad_query);
  at::Tensor key_out = key_reused ? grad_key : detail::empty_contiguous_like(grad_key);
  fuseops::rope_backward_out(grad_query, grad_key, t.cos, t.sin, t.positions, t.interleaved, out,
                             key_out);
  return {out, key_out};
}

// kTranspose=false: rope, whose backward is rope_backward; true:
// rope_backward, whose backward is rope.
template <bool kTranspose>
class RopePairFunction : public torch::autograd::Function<RopePairFunction<kTranspose>> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                               const at::Tensor& cos, const at::Tensor& sin,
                               const std::optional<at::Tensor>& positions, bool interleaved) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    save_tables(ctx, cos, sin, positions, interleaved);
    auto [x, y] = kTranspose ? fuseops::rope_backward(a, b, cos, sin, positions, interleaved)
                             : fuseops::rope(a, b, cos, sin, positions, interleaved);
    return {x, y};
  }

  // `grads` by reference: rope's backward moves the gradients out, so that
  // a sole owner can be overwritten with its rotation
  // (autograd/reusable_gradient.h). That of rope_backward (double backward)
  // allocates.
  static variable_list backward(AutogradContext* ctx, variable_list& grads) {
    const Tables t = saved_tables(ctx);
    at::Tensor ga, gb;
    if (kTranspose) {
      std::tie(ga, gb) = apply(false, grads[0], grads[1], t);
    } else if (grads[0].defined() && grads[1].defined()) {
      std::tie(ga, gb) = rotate_pair_over(grads[0], grads[1], t);
    } else {
      ga = rotate_over(grads[0], t);
      gb = rotate_over(grads[1], t);
    }
    return {ga, gb, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

template <bool kTranspose>
class RopeSingleFunction : public torch::autograd::Function<RopeSingleFunction<kTranspose>> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin, const std::optional<at::Tensor>& positions,
                            bool interleaved) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    save_tables(ctx, cos, sin, positions, interleaved);
    return kTranspose ? fuseops::rope_single_backward(x, cos, sin, positions, interleaved)
                      : fuseops::rope_single(x, cos, sin, positions, interleaved);
  }

  // `grads` by reference, as RopePairFunction's.
  static variable_list backward(AutogradContext* ctx, variable_list& grads) {
    const Tables t = saved_tables(ctx);
    at::Tensor g = kTranspose ? std::get<0>(apply(false, grads[0], at::Tensor(), t))
                              : rotate_over(grads[0], t);
    return {g, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

template <bool kTranspose>
std::tuple<at::Tensor, at::Tensor> pair_autograd(const at::Tensor& a, const at::Tensor& b,
                                                 const at::Tensor& cos, const at::Tensor& sin,
                                                 const std::optional<at::Tensor>& positions,
                                                 bool interleaved) {
  const char* op = kTranspose ? "fuseops::rope_backward" : "fuseops::rope";
  check_floating_input(op, kTranspose ? "grad_query" : "query", a);
  check_floating_input(op, kTranspose ? "grad_key" : "key", b);
  check_floating_input(op, "cos", cos);
  check_floating_input(op, "sin", sin);
  check_tables_not_differentiated(op, cos, sin);
  if (!autograd_detail::records_grad({a, b})) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return kTranspose ? fuseops::rope_backward(a, b, cos, sin, positions, interleaved)
                      : fuseops::rope(a, b, cos, sin, positions, interleaved);
  }
  const variable_list result =
      RopePairFunction<kTranspose>::apply(a, b, cos, sin, positions, interleaved);
  return {result[0], result[1]};
}

template <bool kTranspose>
at::Tensor single_autograd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                           const std::optional<at::Tensor>& positions, bool interleaved) {
  const char* op = kTranspose ? "fuseops::rope_backward.single" : "fuseops::rope.single";
  check_floating_input(op, kTranspose ? "grad_input" : "input", x);
  check_floating_input(op, "cos", cos);
  check_floating_input(op, "sin", sin);
  check_tables_not_differentiated(op, cos, sin);
  if (!autograd_detail::records_grad({x})) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return kTranspose ? fuseops::rope_single_backward(x, cos, sin, positions, interleaved)
                      : fuseops::rope_single(x, cos, sin, positions, interleaved);
  }
  return RopeSingleFunction<kTranspose>::apply(x, cos, sin, positions, interleaved);
}

// The Autograd kernels cpp/ops/rope.yaml declares as functions: rope and
// its backward are one kernel each way, the rotation and its transpose.
struct RopeAutograd {
  static constexpr auto rope = &pair_autograd<false>;
  static constexpr auto rope_single = &single_autograd<false>;
  static constexpr auto rope_backward = &pair_autograd<true>;
  static constexpr auto rope_backward_single = &single_autograd<true>;
};

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) { detail::register_rope_autograd<RopeAutograd>(m); }

}  // namespace fuseops
