// moe_experts CUDA kernels and their registration; checks, layout and
// allocation are shared with the CPU and Meta backends
// (cpp/ops/moe_experts.cpp). Composed of ATen's CUDA ops, with the CPU
// kernels' algorithm and precision (cpp/ops/cpu/moe_experts_kernel.cpp): the
// pairs sorted by expert (a stable sort), each expert's three products on
// its rows in the compute dtype (float32 for bfloat16/float16, on the
// expert's weight widened once per call), a weighted sum per token in the
// order of k. One host synchronisation per call (one copy to the host)
// reads the per-expert row counts and checks the expert numbers; a
// grouped-GEMM kernel without it is still to come (cuda/README.md).

#include <algorithm>
#include <tuple>
#include <vector>

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/scatter_add.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "ops/moe_experts.h"
#include "ops_generated/cuda/moe_experts.h"

namespace fuseops::cuda {
namespace {

using detail::Activation;

struct Routing {
  std::vector<int64_t> offsets;  // experts + 1
  at::Tensor token_of_row, pair_of_row, row_of_pair;
  int64_t rows(int64_t e) const { return offsets[e + 1] - offsets[e]; }
};

Routing route(const at::Tensor& top_k_index, int64_t experts, const char* op) {
  const at::Tensor flat = top_k_index.reshape({-1});
  const int64_t pairs = flat.numel();
  Routing routing;
  routing.offsets.assign(experts + 1, 0);
  if (pairs > 0) {
    // The per-expert counts (of the expert numbers clamped into range, so
    // that counting never reads out of bounds) and the smallest and largest
    // number, copied to the host together: the call's one synchronisation.
    // at::bincount would synchronise twice more, for its own range checks.
    const auto [lowest, highest] = at::aminmax(flat);
    const at::Tensor clamped = flat.clamp(0, std::max<int64_t>(experts - 1, 0)).to(at::kLong);
    at::Tensor counts = at::zeros({experts}, clamped.options());
    if (experts > 0) {
      counts.scatter_add_(0, clamped, at::ones_like(clamped));
    }
    const at::Tensor on_host =
        at::cat({counts, lowest.reshape({1}).to(at::kLong), highest.reshape({1}).to(at::kLong)})
            .cpu();
    const int64_t* count = on_host.const_data_ptr<int64_t>();
    const int64_t lo = count[experts];
    const int64_t hi = count[experts + 1];
    TORCH_CHECK(lo >= 0 && hi < experts, op,
                ": argument 'top_k_index' must hold expert numbers in [0, ", experts, "), got ",
                lo < 0 ? lo : hi);
    for (int64_t e = 0; e < experts; ++e) {
      routing.offsets[e + 1] = routing.offsets[e] + count[e];
    }
  }
  routing.pair_of_row = std::get<1>(at::sort(flat, /*stable=*/true, 0, false));
  routing.token_of_row = routing.pair_of_row.div(top_k_index.size(1), "floor");
  routing.row_of_pair =
      at::empty_like(routing.pair_of_row)
          .scatter_(0, routing.pair_of_row, at::arange(pairs, routing.pair_of_row.options()));
  return routing;
}

at::Tensor activate(const at::Tensor& gate, Activation activation) {
  switch (activation) {
    case Activation::Silu:
      return at::silu(gate);
    case Activation::GeluErf:
      return at::gelu(gate, "none");
    case Activation::GeluTanh:
      return at::gelu(gate, "tanh");
  }
  return {};
}

at::Tensor activation_backward(const at::Tensor& grad, const at::Tensor& gate,
                               Activation activation) {
  switch (activation) {
    case Activation::Silu:
      return at::silu_backward(grad, gate);
    case Activation::GeluErf:
      return at::gelu_backward(grad, gate, "none");
    case Activation::GeluTanh:
      return at::gelu_backward(grad, gate, "tanh");
  }
  return {};
}

// out [T, H] = sum over k of weights[t, k] * rows[row_of_pair[t * K + k]].
void sum_rows_per_token(const at::Tensor& out, const at::Tensor& rows, const at::Tensor& weights,
                        const Routing& routing, int64_t top_k) {
  at::Tensor per_pair =
      at::index_select(rows, 0, routing.row_of_pair).view({out.size(0), top_k, out.size(1)});
  if (weights.defined()) {
    per_pair = per_pair.mul(weights.view({out.size(0), top_k, 1}));
  }
  out.copy_(per_pair.sum(1));
}

void moe_experts_kernel(const at::Tensor& out, const at::Tensor& gate_up_out,
                        const at::Tensor& hidden, const at::Tensor& top_k_index,
                        const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj,
                        const at::Tensor& down_proj, Activation activation, const char* op) {
  const c10::cuda::CUDAGuard guard(hidden.device());
  // The op has no autocast kernel; the ATen products below (at::mm) have
  // one on CUDA, which must not cast the float32 operands here.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t experts = gate_up_proj.size(0);
  const int64_t intermediate = gate_up_proj.size(1) / 2;
  const Routing routing = route(top_k_index, experts, op);
  const at::ScalarType compute = at::toOpMathType(hidden.scalar_type());
  const at::Tensor x = at::index_select(hidden, 0, routing.token_of_row).to(compute);
  const at::Tensor y = at::zeros({x.size(0), hidden.size(1)}, x.options());
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t n = routing.rows(e);
    if (n == 0) {
      continue;
    }
    const at::Tensor h =
        at::mm(x.narrow(0, routing.offsets[e], n), gate_up_proj[e].to(compute).t());
    if (gate_up_out.defined()) {
      gate_up_out.narrow(0, routing.offsets[e], n).copy_(h);
    }
    const at::Tensor a = activate(h.narrow(1, 0, intermediate), activation)
                             .mul(h.narrow(1, intermediate, intermediate));
    at::Tensor rows = y.narrow(0, routing.offsets[e], n);
    at::mm_out(rows, a, down_proj[e].to(compute).t());
  }
  sum_rows_per_token(out, y, top_k_weights.to(compute), routing, top_k_index.size(1));
}

void moe_experts_backward_kernel(const at::Tensor& grad_hidden,
                                 const at::Tensor& grad_top_k_weights,
                                 const at::Tensor& grad_gate_up_proj,
                                 const at::Tensor& grad_down_proj, const at::Tensor& grad_output,
                                 const at::Tensor& hidden, const at::Tensor& top_k_index,
                                 const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj,
                                 const at::Tensor& down_proj, const at::Tensor& gate_up_out,
                                 Activation activation, const char* op) {
  const c10::cuda::CUDAGuard guard(hidden.device());
  // The op has no autocast kernel; the ATen products below (at::mm) have
  // one on CUDA, which must not cast the float32 operands here.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t experts = gate_up_proj.size(0);
  const int64_t intermediate = gate_up_proj.size(1) / 2;
  const bool expert_grads = grad_gate_up_proj.defined();
  const Routing routing = route(top_k_index, experts, op);
  const at::ScalarType compute = at::toOpMathType(hidden.scalar_type());
  const at::Tensor x = at::index_select(hidden, 0, routing.token_of_row).to(compute);
  const at::Tensor g = at::index_select(grad_output, 0, routing.token_of_row).to(compute);
  const at::Tensor row_weights =
      at::index_select(top_k_weights.reshape({-1}), 0, routing.pair_of_row).to(compute);
  const at::Tensor grad_x = at::zeros({x.size(0), hidden.size(1)}, x.options());
  const at::Tensor grad_w = at::zeros({x.size(0)}, x.options());
  if (expert_grads) {
    grad_gate_up_proj.zero_();
    grad_down_proj.zero_();
  }
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t n = routing.rows(e);
    if (n == 0) {
      continue;
    }
    const int64_t first = routing.offsets[e];
    const at::Tensor xe = x.narrow(0, first, n);
    const at::Tensor ge = g.narrow(0, first, n);
    const at::Tensor we = row_weights.narrow(0, first, n).unsqueeze(1);
    const at::Tensor w1 = gate_up_proj[e].to(compute);
    const at::Tensor w2 = down_proj[e].to(compute);
    const at::Tensor h =
        gate_up_out.defined() ? gate_up_out.narrow(0, first, n) : at::mm(xe, w1.t());
    const at::Tensor gate = h.narrow(1, 0, intermediate);
    const at::Tensor up = h.narrow(1, intermediate, intermediate);
    const at::Tensor act = activate(gate, activation);
    const at::Tensor a = act.mul(up);
    const at::Tensor d = at::mm(ge, w2);
    grad_w.narrow(0, first, n).copy_(d.mul(a).sum(1));
    if (expert_grads) {
      grad_down_proj[e].copy_(at::mm(ge.t(), a.mul(we)));
    }
    const at::Tensor dw = d.mul(we);
    const at::Tensor grad_h =
        at::cat({activation_backward(dw.mul(up), gate, activation), dw.mul(act)}, 1);
    if (expert_grads) {
      grad_gate_up_proj[e].copy_(at::mm(grad_h.t(), xe));
    }
    grad_x.narrow(0, first, n).copy_(at::mm(grad_h, w1));
  }
  if (grad_hidden.numel() > 0) {
    sum_rows_per_token(grad_hidden, grad_x, at::Tensor(), routing, top_k_index.size(1));
  }
  grad_top_k_weights.view({-1}).copy_(at::index_select(grad_w, 0, routing.row_of_pair));
}

}  // namespace

FUSEOPS_REGISTER_KERNEL(MoeExpertsCudaKernels::forward, &moe_experts_kernel);
FUSEOPS_REGISTER_KERNEL(MoeExpertsCudaKernels::backward, &moe_experts_backward_kernel);

}  // namespace fuseops::cuda
