// A program whose debug information only declares c10::TensorImpl (it does
// not include cpp/debug/gdb_types.cpp): the printers must say what is
// missing, and `fuseops-load-types` must fix it (tests_py/test_gdb.py).

#include <ATen/core/Tensor.h>

extern "C" __attribute__((noinline)) void fixture_stop(void* const* cases, int count) {
  asm volatile("" : : "r"(cases), "r"(count) : "memory");
}

int main() {
  at::Tensor undefined;
  void* const cases[] = {&undefined};
  fixture_stop(cases, 1);
  return 0;
}
