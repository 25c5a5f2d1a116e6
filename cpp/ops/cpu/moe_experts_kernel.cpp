// moe_experts CPU kernels; compiled once per CPU capability
// (FuseopsCpuKernels.cmake). The (token, k) pairs are sorted by expert (a
// counting sort, stable in the token order); each expert then runs its gated
// MLP on its rows as three matrix products of the rows it got (ATen's GEMMs
// in the compute dtype: float32 for bfloat16/float16 on the expert's weight
// widened once per call, float64 for float64) and the gated activation
// kernel between them; a last pass adds each token's K rows, weighted, in the
// order of k, into the output (no two threads write one row, so the result
// does not depend on the number of threads).

#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/mm.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <fuseops/linear.h>

#include "ops/common/output_memory.h"
#include "ops_generated/cpu/gated_activation.h"
#include "ops_generated/cpu/moe_experts.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

using detail::Activation;

// The pairs p = t * K + k sorted by expert: expert e's rows are [offsets[e],
// offsets[e + 1]); pair_of_row, token_of_row and row_of_pair map between
// the two orders.
struct Routing {
  std::vector<int64_t> offsets;
  at::Tensor token_of_row;  // [T * K] int64
  at::Tensor pair_of_row;   // [T * K] int64
  at::Tensor row_of_pair;   // [T * K] int64
  int64_t rows(int64_t expert) const { return offsets[expert + 1] - offsets[expert]; }
  // The most rows one expert has (the size of the per-expert buffers).
  int64_t most_rows() const {
    int64_t most = 0;
    for (size_t e = 0; e + 1 < offsets.size(); ++e) {
      most = std::max(most, rows(static_cast<int64_t>(e)));
    }
    return most;
  }
};

Routing route(const at::Tensor& top_k_index, int64_t experts, const char* op) {
  const int64_t pairs = top_k_index.numel();
  const int64_t top_k = top_k_index.size(1);
  const int64_t* index = top_k_index.const_data_ptr<int64_t>();
  Routing routing;
  routing.offsets.assign(experts + 1, 0);
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t e = index[p];
    TORCH_CHECK(e >= 0 && e < experts, op,
                ": argument 'top_k_index' must hold expert numbers in [0, ", experts, "), got ", e,
                " at [", p / top_k, ", ", p % top_k, "]");
    ++routing.offsets[e + 1];
  }
  for (int64_t e = 0; e < experts; ++e) {
    routing.offsets[e + 1] += routing.offsets[e];
  }
  std::vector<int64_t> next(routing.offsets.begin(), routing.offsets.end() - 1);
  const auto long_options = top_k_index.options().dtype(at::kLong);
  routing.token_of_row = at::empty({pairs}, long_options);
  routing.pair_of_row = at::empty({pairs}, long_options);
  routing.row_of_pair = at::empty({pairs}, long_options);
  int64_t* token_of_row = routing.token_of_row.mutable_data_ptr<int64_t>();
  int64_t* pair_of_row = routing.pair_of_row.mutable_data_ptr<int64_t>();
  int64_t* row_of_pair = routing.row_of_pair.mutable_data_ptr<int64_t>();
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t row = next[index[p]]++;
    row_of_pair[p] = row;
    pair_of_row[row] = p;
    token_of_row[row] = p / top_k;
  }
  return routing;
}

// `weight` in the compute dtype: itself, or widened into `buffer` (reused
// from expert to expert).
at::Tensor in_compute_dtype(const at::Tensor& weight, at::Tensor& buffer, at::ScalarType compute) {
  if (weight.scalar_type() == compute) {
    return weight;
  }
  if (!buffer.defined()) {
    buffer = detail::empty_output(weight.sizes(), weight.options().dtype(compute));
  }
  return buffer.copy_(weight);
}

// out [n, N] (compute dtype) = x [n, K] (compute dtype) @ weight^T, weight
// [N, K] of the inputs' dtype. A bfloat16/float16 weight that only a few
// rows meet (decoding) goes through fuseops.linear's streaming kernel, which
// reads it once in its own dtype: widening it would cost more than the
// product. That product is rounded to the weight's dtype, as transformers'
// loop rounds every product; from kLinearWidenedRows rows the weight is
// widened and the product stays in float32.
void expert_product(const at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                    at::Tensor& buffer, at::ScalarType compute) {
  if (weight.scalar_type() != compute && x.size(0) < kLinearWidenedRows) {
    // moe_experts has no autocast kernel: under autocast, linear's own cast
    // must not apply to the products it makes here.
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    out.copy_(fuseops::linear(x.to(weight.scalar_type()), weight, std::nullopt));
    return;
  }
  at::Tensor target = out;
  at::mm_out(target, x, in_compute_dtype(weight, buffer, compute).t());
}

// out[t] = sum over k of weight(t, k) * rows[row_of_pair[t * K + k]], summed
// in the compute dtype in the order of k and rounded once; `weights` [T * K]
// in the compute dtype, or nullptr for weight 1.
template <typename scalar_t, typename opmath_t>
void sum_rows_per_token(const at::Tensor& out, const at::Tensor& rows, const opmath_t* weights,
                        const Routing& routing, int64_t top_k) {
  const int64_t tokens = out.size(0);
  const int64_t hidden = out.size(1);
  scalar_t* out_data = out.mutable_data_ptr<scalar_t>();
  const opmath_t* row_data = rows.const_data_ptr<opmath_t>();
  const int64_t* row_of_pair = routing.row_of_pair.const_data_ptr<int64_t>();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, hidden * top_k));
  at::parallel_for(0, tokens, grain, [&](int64_t t0, int64_t t1) {
    std::vector<opmath_t> sum(hidden);
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(sum.begin(), sum.end(), opmath_t(0));
      for (int64_t k = 0; k < top_k; ++k) {
        const int64_t p = t * top_k + k;
        const opmath_t w = weights == nullptr ? opmath_t(1) : weights[p];
        const opmath_t* row = row_data + row_of_pair[p] * hidden;
        for (int64_t h = 0; h < hidden; ++h) {
          sum[h] += w * row[h];
        }
      }
      scalar_t* o = out_data + t * hidden;
      for (int64_t h = 0; h < hidden; ++h) {
        o[h] = static_cast<scalar_t>(sum[h]);
      }
    }
  });
}

void sum_rows_per_token(const at::Tensor& out, const at::Tensor& rows, const at::Tensor& weights,
                        const Routing& routing, int64_t top_k) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, out.scalar_type(), "fuseops::moe_experts", [&] {
        using opmath_t = at::opmath_type<scalar_t>;
        sum_rows_per_token<scalar_t, opmath_t>(
            out, rows, weights.defined() ? weights.const_data_ptr<opmath_t>() : nullptr, routing,
            top_k);
      });
}

void moe_experts_kernel_impl(const at::Tensor& out, const at::Tensor& gate_up_out,
                             const at::Tensor& hidden, const at::Tensor& top_k_index,
                             const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj,
                             const at::Tensor& down_proj, Activation activation, const char* op) {
  const int64_t experts = gate_up_proj.size(0);
  const int64_t intermediate = gate_up_proj.size(1) / 2;
  const int64_t top_k = top_k_index.size(1);
  const Routing routing = route(top_k_index, experts, op);
  const at::ScalarType compute = at::toOpMathType(hidden.scalar_type());
  const auto options = hidden.options().dtype(compute);
  // Every pair's input row and result row, in the experts' order.
  const at::Tensor x = at::index_select(hidden, 0, routing.token_of_row).to(compute);
  const at::Tensor y = detail::empty_output({x.size(0), hidden.size(1)}, options);
  const int64_t most_rows = routing.most_rows();
  // Each expert's first product goes to its rows of gate_up_out when the
  // backward will read it, else to a scratch buffer.
  const at::Tensor gate_up = gate_up_out.defined()
                                 ? gate_up_out
                                 : detail::empty_output({most_rows, 2 * intermediate}, options);
  const at::Tensor gated = detail::empty_output({most_rows, intermediate}, options);
  at::Tensor gate_up_buffer, down_buffer;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t n = routing.rows(e);
    if (n == 0) {
      continue;
    }
    const int64_t first = routing.offsets[e];
    const at::Tensor h = gate_up.narrow(0, gate_up_out.defined() ? first : 0, n);
    expert_product(h, x.narrow(0, first, n), gate_up_proj[e], gate_up_buffer, compute);
    at::Tensor a = gated.narrow(0, 0, n);
    if (intermediate > 0) {
      GatedActivationCpuKernels::forward()(a, h.narrow(1, 0, intermediate),
                                           h.narrow(1, intermediate, intermediate), activation);
    }
    expert_product(y.narrow(0, first, n), a, down_proj[e], down_buffer, compute);
  }
  sum_rows_per_token(out, y, top_k_weights.to(compute), routing, top_k);
}

// Per expert, on its rows x (inputs), g (the output gradient of each row's
// token) and w (routing weights), with h = x @ W1^T = [gate | up] (the
// forward's, or recomputed) and a = act(gate) * up:
//   d = g @ W2                    the gradient of a, before the weight
//   grad_w = rowsum(d * a)
//   grad_W2 = g^T @ (w * a)
//   [dgate | dup] = gated backward of w * d
//   grad_W1 = [dgate | dup]^T @ x
//   grad_x = [dgate | dup] @ W1   summed per token like the forward.
void moe_experts_backward_kernel_impl(
    const at::Tensor& grad_hidden, const at::Tensor& grad_top_k_weights,
    const at::Tensor& grad_gate_up_proj, const at::Tensor& grad_down_proj,
    const at::Tensor& grad_output, const at::Tensor& hidden, const at::Tensor& top_k_index,
    const at::Tensor& top_k_weights, const at::Tensor& gate_up_proj, const at::Tensor& down_proj,
    const at::Tensor& gate_up_out, Activation activation, const char* op) {
  const int64_t experts = gate_up_proj.size(0);
  const int64_t intermediate = gate_up_proj.size(1) / 2;
  const int64_t top_k = top_k_index.size(1);
  const bool expert_grads = grad_gate_up_proj.defined();
  const Routing routing = route(top_k_index, experts, op);
  const at::ScalarType compute = at::toOpMathType(hidden.scalar_type());
  const auto options = hidden.options().dtype(compute);
  const at::Tensor x = at::index_select(hidden, 0, routing.token_of_row).to(compute);
  const at::Tensor g = at::index_select(grad_output, 0, routing.token_of_row).to(compute);
  const at::Tensor row_weights =
      at::index_select(top_k_weights.reshape({-1}), 0, routing.pair_of_row).to(compute);
  const at::Tensor grad_x = detail::empty_output({x.size(0), hidden.size(1)}, options);
  const at::Tensor grad_w = at::empty({x.size(0)}, options);
  const int64_t most_rows = routing.most_rows();
  const at::Tensor gate_up = gate_up_out.defined()
                                 ? gate_up_out
                                 : detail::empty_output({most_rows, 2 * intermediate}, options);
  const at::Tensor grad_gate_up = detail::empty_output({most_rows, 2 * intermediate}, options);
  const at::Tensor gated = detail::empty_output({most_rows, intermediate}, options);
  const at::Tensor grad_gated = detail::empty_output({most_rows, intermediate}, options);
  at::Tensor gate_up_buffer, down_buffer, grad_gate_up_buffer, grad_down_buffer;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t n = routing.rows(e);
    if (n == 0) {
      if (expert_grads) {
        grad_gate_up_proj[e].zero_();
        grad_down_proj[e].zero_();
      }
      continue;
    }
    const int64_t first = routing.offsets[e];
    const at::Tensor xe = x.narrow(0, first, n);
    const at::Tensor ge = g.narrow(0, first, n);
    const at::Tensor we = row_weights.narrow(0, first, n).unsqueeze(1);
    const at::Tensor w1 = in_compute_dtype(gate_up_proj[e], gate_up_buffer, compute);
    const at::Tensor w2 = in_compute_dtype(down_proj[e], down_buffer, compute);
    at::Tensor h = gate_up.narrow(0, gate_up_out.defined() ? first : 0, n);
    if (!gate_up_out.defined()) {
      at::mm_out(h, xe, w1.t());
    }
    const at::Tensor gate = h.narrow(1, 0, intermediate);
    const at::Tensor up = h.narrow(1, intermediate, intermediate);
    at::Tensor a = gated.narrow(0, 0, n);
    if (intermediate > 0) {
      GatedActivationCpuKernels::forward()(a, gate, up, activation);
    }
    at::Tensor d = grad_gated.narrow(0, 0, n);
    at::mm_out(d, ge, w2);
    grad_w.narrow(0, first, n).copy_(d.mul(a).sum(1));
    if (expert_grads) {
      a.mul_(we);
      if (grad_down_proj.scalar_type() == compute) {
        at::Tensor target = grad_down_proj[e];
        at::mm_out(target, ge.t(), a);
      } else {
        if (!grad_down_buffer.defined()) {
          grad_down_buffer = detail::empty_output(w2.sizes(), options);
        }
        at::mm_out(grad_down_buffer, ge.t(), a);
        grad_down_proj[e].copy_(grad_down_buffer);
      }
    }
    d.mul_(we);
    const at::Tensor grad_h = grad_gate_up.narrow(0, 0, n);
    if (intermediate > 0) {
      GatedActivationCpuKernels::backward()(grad_h.narrow(1, 0, intermediate),
                                            grad_h.narrow(1, intermediate, intermediate), d, gate,
                                            up, activation);
    }
    if (expert_grads) {
      if (grad_gate_up_proj.scalar_type() == compute) {
        at::Tensor target = grad_gate_up_proj[e];
        at::mm_out(target, grad_h.t(), xe);
      } else {
        if (!grad_gate_up_buffer.defined()) {
          grad_gate_up_buffer = detail::empty_output(w1.sizes(), options);
        }
        at::mm_out(grad_gate_up_buffer, grad_h.t(), xe);
        grad_gate_up_proj[e].copy_(grad_gate_up_buffer);
      }
    }
    at::Tensor grad_rows = grad_x.narrow(0, first, n);
    at::mm_out(grad_rows, grad_h, w1);
  }
  if (grad_hidden.numel() > 0) {
    sum_rows_per_token(grad_hidden, grad_x, at::Tensor(), routing, top_k);
  }
  grad_top_k_weights.view({-1}).copy_(at::index_select(grad_w, 0, routing.row_of_pair));
}

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(MoeExpertsCpuKernels::forward, &moe_experts_kernel_impl);
FUSEOPS_REGISTER_CPU_KERNEL(MoeExpertsCpuKernels::backward, &moe_experts_backward_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
