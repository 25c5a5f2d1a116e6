// Uses fuseops the way a LibTorch application would: forward, then gradients
// through fuseops' C++ autograd, no Python involved. Exits non-zero on any
// mismatch so the test that runs it can fail.

#include <cstdio>

#include <ATen/ATen.h>

#include <fuseops/fuseops.h>

int main() {
  at::manual_seed(0);
  const at::Tensor x = at::randn({64, 33}).requires_grad_();

  const at::Tensor y = fuseops::relu(x);
  y.sum().backward();

  const at::Tensor expected_y = at::relu(x.detach());
  const at::Tensor expected_grad = (x.detach() > 0).to(at::kFloat);
  const bool forward_ok = at::equal(y.detach(), expected_y);
  const bool backward_ok = x.grad().defined() && at::equal(x.grad(), expected_grad);

  const fuseops::BuildInfo info = fuseops::build_info();
  std::printf("fuseops %s (torch %s), CPU build %s: forward %s, backward %s\n",
              info.version.c_str(), info.torch_version.c_str(),
              info.selected_cpu_capability.c_str(), forward_ok ? "ok" : "WRONG",
              backward_ok ? "ok" : "WRONG");
  return forward_ok && backward_ok ? 0 : 1;
}
