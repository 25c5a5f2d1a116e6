// Many C++ threads calling fuseops ops at once (each op's kernels split their
// rows over ATen's intra-op pool too) get, bit for bit, what one thread got:
// the kernels keep no state between calls and write only their outputs.

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include <fuseops/fuseops.h>

#include "test_helpers.h"

namespace {

using fuseops::testing::threads_cases;
using fuseops::testing::ThreadsInputs;

// Every family's threads case (FUSEOPS_THREADS_CASE, beside its tests), in
// one list of results.
std::vector<at::Tensor> calls(const ThreadsInputs& in) {
  std::vector<at::Tensor> out;
  for (const auto& [name, make] : threads_cases()) {
    for (at::Tensor& t : make(in)) out.push_back(std::move(t));
  }
  return out;
}

TEST(Threads, ConcurrentCallsGiveTheSingleThreadedResults) {
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const auto options = at::TensorOptions().dtype(dtype);
    // Elementwise ops, gated ones, row reductions with their backward
    // (weight gradients summed over rows), losses over rows.
    ASSERT_GE(threads_cases().size(), 5u);
    const ThreadsInputs in{at::randn({257, 131}, options), at::randn({131}, options),
                           at::randn({257, 131}, options), at::randint(0, 131, {257}, at::kLong)};
    const std::vector<at::Tensor> expected = calls(in);

    constexpr int kThreads = 8;
    constexpr int kRepeats = 4;
    std::vector<std::vector<std::vector<at::Tensor>>> results(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int r = 0; r < kRepeats; ++r) results[t].push_back(calls(in));
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
