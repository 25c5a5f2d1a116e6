// A program like a pip user's: its debug information only declares
// c10::TensorImpl and friends (it does not include cpp/debug/gdb_types.cpp).
// The printers must say what is missing, and `fuseops-load-types` with the
// installed types object must fix it, live and on a core file
// (tests_py/test_gdb.py).

#include <ATen/ATen.h>

extern "C" __attribute__((noinline)) void fixture_stop(void* const* cases, int count) {
  asm volatile("" : : "r"(cases), "r"(count) : "memory");
}

int main() {
  at::Tensor undefined;
  at::Tensor contiguous_float = at::arange(6, at::kFloat).reshape({2, 3});
  // A view: its autograd metadata is a DifferentiableViewMeta, a class the
  // types object does not describe.
  at::Tensor transposed = contiguous_float.t();
  at::Tensor with_grad = at::ones({3}, at::kFloat).set_requires_grad(true);
  with_grad.mutable_grad() = at::full({3}, 0.5, at::kFloat);
  at::Tensor without_grad = at::zeros({2}, at::kDouble).set_requires_grad(true);
  void* const cases[] = {&undefined, &contiguous_float, &transposed, &with_grad, &without_grad};
  fixture_stop(cases, static_cast<int>(sizeof(cases) / sizeof(cases[0])));
  return 0;
}
