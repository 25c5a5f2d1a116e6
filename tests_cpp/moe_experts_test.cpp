// fuseops::moe_experts and its backward through the dispatcher: forward and
// every gradient against a float64 per-pair loop of ATen ops differentiated
// by autograd, on every compiled CPU build and in every dtype. Tolerances:
// float32/float64 1e-5 relative to the largest value (float32 products of
// rows of a few dozen terms); bfloat16/float16 compute in float32 on the
// rounded inputs and round each result once, so the reference runs on the
// same rounded inputs and the bound is two units of the dtype's last place
// (2^-7 bfloat16, 2^-10 float16) of the largest value.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <fuseops/fuseops.h>

#include "test_helpers.h"

#include "ops/cpu/dispatch.h"

namespace {

using fuseops::testing::expect_error_mentions;
using fuseops::testing::kDtypes;

class MoeExperts : public fuseops::testing::DeviceTest {};
FUSEOPS_TEST_ON_DEVICES(MoeExperts);

double tolerance(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16:
      return 2.0 / 128;
    case at::kHalf:
      return 2.0 / 1024;
    default:
      return 1e-5;
  }
}

// `computed_in`: the dtype of the computation (the routing weights' gradient
// has their dtype, float32, but comes of products in the inputs' dtype).
void expect_close(const at::Tensor& actual, const at::Tensor& expected, const char* what,
                  std::optional<at::ScalarType> computed_in = std::nullopt) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double scale = std::max(1.0, expected.numel() ? expected.abs().max().item<double>() : 0.0);
  const double err =
      actual.numel() ? (actual.to(at::kDouble) - expected).abs().max().item<double>() : 0.0;
  EXPECT_LE(err, tolerance(computed_in.value_or(actual.scalar_type())) * scale) << what;
}

at::Tensor activate(const at::Tensor& x, const std::string& activation) {
  if (activation == "silu") {
    return at::silu(x);
  }
  return at::gelu(x, activation == "gelu" ? "none" : "tanh");
}

// The per-pair definition, in float64: out[t] = sum_k w[t,k] * expert(x[t]).
at::Tensor reference(const at::Tensor& hidden, const at::Tensor& index, const at::Tensor& weights,
                     const at::Tensor& gate_up, const at::Tensor& down,
                     const std::string& activation) {
  const int64_t inter = gate_up.size(1) / 2;
  std::vector<at::Tensor> rows;
  for (int64_t t = 0; t < hidden.size(0); ++t) {
    at::Tensor sum = at::zeros({hidden.size(1)}, hidden.options());
    for (int64_t k = 0; k < index.size(1); ++k) {
      const int64_t e = index[t][k].item<int64_t>();
      const at::Tensor h = at::mv(gate_up[e], hidden[t]);
      const at::Tensor a = activate(h.narrow(0, 0, inter), activation) * h.narrow(0, inter, inter);
      sum = sum + weights[t][k] * at::mv(down[e], a);
    }
    rows.push_back(sum);
  }
  return rows.empty() ? at::zeros({0, hidden.size(1)}, hidden.options()) : at::stack(rows);
}

TEST_P(MoeExperts, ForwardAndGradientsMatchFloat64OnEveryBuild) {
  // 37 tokens, top 3 of 5 experts: expert 4 gets no token, token 0 goes to
  // expert 1 twice, the routing weights are of another dtype.
  const int64_t tokens = 37, hidden_size = 24, inter = 20, experts = 5, top_k = 3;
  at::Tensor index = at::randint(0, experts - 1, {tokens, top_k}, options(at::kLong));
  index[0][0] = 1;
  index[0][2] = 1;
  const auto caps = GetParam() == at::kCPU ? fuseops::cpu::runnable_capabilities()
                                           : std::vector{fuseops::cpu::CpuCapability::DEFAULT};
  for (auto capability : caps) {
    std::optional<fuseops::cpu::ScopedCapabilityOverride> force;
    if (GetParam() == at::kCPU) {
      force.emplace(capability);
    }
    for (auto dtype : kDtypes) {
      for (const std::string activation : {"silu", "gelu", "gelu_tanh"}) {
        SCOPED_TRACE(testing::Message() << fuseops::cpu::capability_name(capability) << " " << dtype
                                        << " " << activation);
        const at::Tensor x = at::randn({tokens, hidden_size}, options(dtype));
        const at::Tensor w = at::rand({tokens, top_k}, options(at::kFloat));
        const at::Tensor gu =
            (at::randn({experts, 2 * inter, hidden_size}, options()) * 0.3).to(dtype);
        // down_proj transposed in memory: the kernels take any strides.
        const at::Tensor dn =
            (at::randn({experts, inter, hidden_size}, options()) * 0.3).to(dtype).transpose(1, 2);
        const at::Tensor g = at::randn({tokens, hidden_size}, options(dtype));
        std::vector<at::Tensor> leaves;
        for (const at::Tensor& t : {x, w, gu, dn}) {
          leaves.push_back(t.to(at::kDouble, false, /*copy=*/true).requires_grad_());
        }
        const at::Tensor want =
            reference(leaves[0], index, leaves[1], leaves[2], leaves[3], activation);
        const auto want_grads = torch::autograd::grad({want}, leaves, {g.to(at::kDouble)});
        expect_close(fuseops::moe_experts(x, index, w, gu, dn, activation), want, "out");
        const auto [gx, gw, ggu, gdn] =
            fuseops::moe_experts_backward(g, x, index, w, gu, dn, activation, true);
        expect_close(gx, want_grads[0], "grad_hidden");
        expect_close(gw, want_grads[1], "grad_top_k_weights");
        expect_close(ggu, want_grads[2], "grad_gate_up_proj");
        expect_close(gdn, want_grads[3], "grad_down_proj");
        // The forward's kept first products give the recomputed ones' bits
        // in float32/float64; bfloat16/float16 experts given fewer than 32
        // rows keep products rounded to the dtype (the streaming linear),
        // which the recompute does not round.
        const auto [out, kept] = fuseops::moe_experts_forward(x, index, w, gu, dn, activation);
        EXPECT_TRUE(at::equal(out, fuseops::moe_experts(x, index, w, gu, dn, activation)));
        const auto with_kept =
            fuseops::moe_experts_backward(g, x, index, w, gu, dn, activation, true, kept);
        if (dtype == at::kFloat || dtype == at::kDouble) {
          EXPECT_TRUE(at::equal(std::get<0>(with_kept), gx));
          EXPECT_TRUE(at::equal(std::get<2>(with_kept), ggu));
        }
        expect_close(std::get<0>(with_kept), want_grads[0], "grad_hidden (kept)");
        expect_close(std::get<1>(with_kept), want_grads[1], "grad_top_k_weights (kept)", dtype);
        expect_close(std::get<2>(with_kept), want_grads[2], "grad_gate_up_proj (kept)");
        expect_close(std::get<3>(with_kept), want_grads[3], "grad_down_proj (kept)");
        const auto frozen =
            fuseops::moe_experts_backward(g, x, index, w, gu, dn, activation, false);
        EXPECT_EQ(std::get<2>(frozen).numel(), 0);
        EXPECT_TRUE(at::equal(std::get<0>(frozen), gx));
      }
    }
  }
}

TEST_P(MoeExperts, AutogradGivesTheBackwardOpsGradients) {
  const at::Tensor index = at::randint(0, 4, {9, 2}, options(at::kLong));
  const at::Tensor x = at::randn({9, 8}, options()).requires_grad_();
  const at::Tensor w = at::rand({9, 2}, options()).requires_grad_();
  const at::Tensor gu = at::randn({4, 12, 8}, options()).requires_grad_();
  const at::Tensor dn = at::randn({4, 8, 6}, options()).requires_grad_();
  const at::Tensor g = at::randn({9, 8}, options());
  const auto grads =
      torch::autograd::grad({fuseops::moe_experts(x, index, w, gu, dn)}, {x, w, gu, dn}, {g});
  c10::NoGradGuard no_grad;
  const auto [gx, gw, ggu, gdn] = fuseops::moe_experts_backward(g, x, index, w, gu, dn);
  EXPECT_TRUE(at::equal(grads[0], gx));
  EXPECT_TRUE(at::equal(grads[1], gw));
  EXPECT_TRUE(at::equal(grads[2], ggu));
  EXPECT_TRUE(at::equal(grads[3], gdn));
}

TEST_P(MoeExperts, EmptyRoutingGivesZeros) {
  const at::Tensor x = at::randn({6, 8}, options());
  const at::Tensor index = at::zeros({6, 0}, options(at::kLong));
  const at::Tensor w = at::zeros({6, 0}, options());
  const at::Tensor gu = at::randn({3, 10, 8}, options());
  const at::Tensor dn = at::randn({3, 8, 5}, options());
  EXPECT_TRUE(at::equal(fuseops::moe_experts(x, index, w, gu, dn), at::zeros({6, 8}, options())));
  const auto [gx, gw, ggu, gdn] = fuseops::moe_experts_backward(x, x, index, w, gu, dn);
  EXPECT_TRUE(at::equal(gx, at::zeros_like(x)));
  EXPECT_TRUE(at::equal(ggu, at::zeros_like(gu)));
  EXPECT_TRUE(at::equal(gdn, at::zeros_like(dn)));
}

TEST_P(MoeExperts, BadInputNamesTheOpAndArgument) {
  const at::Tensor x = at::randn({6, 8}, options());
  const at::Tensor index = at::randint(0, 3, {6, 2}, options(at::kLong));
  const at::Tensor w = at::rand({6, 2}, options());
  const at::Tensor gu = at::randn({3, 10, 8}, options());
  const at::Tensor dn = at::randn({3, 8, 5}, options());
  expect_error_mentions([&] { fuseops::moe_experts(x, index.clone().fill_(3), w, gu, dn); },
                        {"fuseops::moe_experts", "'top_k_index'", "[0, 3)", "got 3"});
  expect_error_mentions([&] { fuseops::moe_experts(x, index.clone().fill_(-1), w, gu, dn); },
                        {"fuseops::moe_experts", "'top_k_index'", "got -1"});
  expect_error_mentions([&] { fuseops::moe_experts(x, index.to(at::kFloat), w, gu, dn); },
                        {"fuseops::moe_experts", "'top_k_index'", "int64 or int32"});
  expect_error_mentions([&] { fuseops::moe_experts(x, index, w, gu.narrow(2, 0, 7), dn); },
                        {"fuseops::moe_experts", "'gate_up_proj'"});
  expect_error_mentions([&] { fuseops::moe_experts(x, index, w, gu, dn.narrow(2, 0, 4)); },
                        {"fuseops::moe_experts", "'down_proj'", "[3, 8, 5]"});
  expect_error_mentions([&] { fuseops::moe_experts(x, index, w.narrow(1, 0, 1), gu, dn); },
                        {"fuseops::moe_experts", "'top_k_weights'"});
  expect_error_mentions([&] { fuseops::moe_experts(x, index, w, gu.to(at::kDouble), dn); },
                        {"fuseops::moe_experts", "'gate_up_proj'"});
  expect_error_mentions([&] { fuseops::moe_experts(x, index, w, gu, dn, "relu"); },
                        {"fuseops::moe_experts", "'activation'", "relu"});
  expect_error_mentions([&] { fuseops::moe_experts(x, at::Tensor(), w, gu, dn); },
                        {"fuseops::moe_experts", "'top_k_index'"});
  expect_error_mentions(
      [&] { fuseops::moe_experts_backward(x, x, index.clone().fill_(5), w, gu, dn); },
      {"fuseops::moe_experts_backward", "'top_k_index'"});
}

FUSEOPS_THREADS_CASE(moe_experts) {
  // The 257 tokens of x, each to experts (t mod 4) and (t * 7 mod 4) of 4,
  // with weights and experts' matrices cut from the shared inputs.
  const at::Tensor tokens = at::arange(in.x.size(0), in.x.options().dtype(at::kLong));
  const at::Tensor index = at::stack({tokens.remainder(4), (tokens * 7).remainder(4)}, 1);
  const at::Tensor weights = in.g.narrow(1, 0, 2);
  const at::Tensor gate_up = in.x.narrow(0, 0, 4 * 32).reshape({4, 32, in.x.size(1)});
  const at::Tensor dn = in.x.narrow(0, 0, 4 * 16).reshape({4, 16, in.x.size(1)}).transpose(1, 2);
  const auto [gx, gw, ggu, gdn] =
      fuseops::moe_experts_backward(in.g, in.x, index, weights, gate_up, dn);
  return {fuseops::moe_experts(in.x, index, weights, gate_up, dn), gx, gw, ggu, gdn};
}

}  // namespace
