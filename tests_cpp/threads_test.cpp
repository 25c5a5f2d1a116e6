// Many C++ threads calling fuseops ops at once (each op's kernels split their
// rows over ATen's intra-op pool too) get, bit for bit, what one thread got:
// the kernels keep no state between calls and write only their outputs.

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include <fuseops/fuseops.h>

namespace {

// One call of each kind of op: elementwise, gated, row reductions with
// their backward (weight gradients summed over rows), a loss over rows.
std::vector<at::Tensor> calls(const at::Tensor& x, const at::Tensor& w, const at::Tensor& g,
                              const at::Tensor& target) {
  std::vector<at::Tensor> out = {fuseops::relu(x),
                                 fuseops::gelu(x, "tanh"),
                                 fuseops::silu(x),
                                 fuseops::swiglu(x, g),
                                 fuseops::rms_norm(x, w, 1e-6),
                                 fuseops::layer_norm(x, w, w, 1e-5),
                                 fuseops::cross_entropy(x, target),
                                 fuseops::jsd(x, g, target)};
  auto [y, rstd] = fuseops::rms_norm_forward(x, w, 1e-6);
  auto [grad_x, grad_w] = fuseops::rms_norm_backward(g, x, w, rstd);
  out.insert(out.end(), {y, rstd, grad_x, grad_w});
  return out;
}

TEST(Threads, ConcurrentCallsGiveTheSingleThreadedResults) {
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const auto options = at::TensorOptions().dtype(dtype);
    const at::Tensor x = at::randn({257, 131}, options);
    const at::Tensor w = at::randn({131}, options);
    const at::Tensor g = at::randn({257, 131}, options);
    const at::Tensor target = at::randint(0, 131, {257}, at::kLong);
    const std::vector<at::Tensor> expected = calls(x, w, g, target);

    constexpr int kThreads = 8;
    constexpr int kRepeats = 4;
    std::vector<std::vector<std::vector<at::Tensor>>> results(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int r = 0; r < kRepeats; ++r) results[t].push_back(calls(x, w, g, target));
      });
    }
    for (auto& thread : threads) thread.join();
    for (int t = 0; t < kThreads; ++t) {
      ASSERT_EQ(results[t].size(), static_cast<size_t>(kRepeats));
      for (const auto& got : results[t]) {
        ASSERT_EQ(got.size(), expected.size());
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_TRUE(at::equal(got[i], expected[i])) << "thread " << t << ", call " << i;
        }
      }
    }
  }
}

}  // namespace
