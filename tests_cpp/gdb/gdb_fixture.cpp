// The program the gdb printer tests inspect (tests_py/test_gdb.py).
//
// main() builds one variable per printed case and hands all their addresses
// to fixture_stop(), where the tests put a breakpoint: the variables are then
// alive and in memory, also in the -O2 build. Values are chosen to be exact
// in their dtype, so the expected output never depends on rounding.

#include <ATen/ATen.h>
#include <c10/core/SymNodeImpl.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/variable.h>

#include <complex>
#include <cstdio>
#include <cstring>
#include <optional>

namespace {

// A symbolic integer as torch.compile's shape environment makes them, with a
// fixed name; only enough of SymNodeImpl for TensorImpl to store it.
class FixtureSymNode : public c10::SymNodeImpl {
 public:
  explicit FixtureSymNode(int64_t hint) : hint_(hint) {}
  bool is_int() override { return true; }
  bool is_bool() override { return false; }
  bool is_float() override { return false; }
  bool is_symbolic() override { return true; }
  std::string str() override { return "s0"; }
  std::optional<int64_t> maybe_as_int() override { return std::nullopt; }
  int64_t guard_int(const char*, int64_t) override { return hint_; }
  c10::SymNode clone() override { return c10::make_intrusive<FixtureSymNode>(hint_); }
  c10::SymNode wrap_int(int64_t num) override { return c10::make_intrusive<FixtureSymNode>(num); }

 private:
  int64_t hint_;
};

}  // namespace

// The tests break here; `up` shows main's variables.
extern "C" __attribute__((noinline)) void fixture_stop(void* const* cases, int count) {
  asm volatile("" : : "r"(cases), "r"(count) : "memory");
}

int main() {
  at::Tensor contiguous_float = at::arange(6, at::kFloat).reshape({2, 3});
  at::Tensor transposed = contiguous_float.t();
  at::Tensor sliced = at::arange(12, at::kFloat).reshape({4, 3}).slice(0, 1, 3);
  at::Tensor bf16 = at::tensor({-1.5f, 0.0f, 0.25f, 3.0f}).to(at::kBFloat16);
  at::Tensor fp16 = at::tensor({1.0f, -0.5f, 1024.0f}).to(at::kHalf);
  at::Tensor int64 = at::arange(-3, 3, at::kLong).reshape({2, 3});
  at::Tensor boolean = at::arange(3, at::kLong).remainder(2).eq(0);
  at::Tensor scalar = at::scalar_tensor(2.5, at::kDouble);
  at::Tensor empty = at::empty({0, 3}, at::kFloat);
  at::Tensor undefined;
  at::Tensor seven_dim = at::arange(12, at::kInt).reshape({1, 2, 1, 3, 1, 2, 1});
  at::Tensor requires_grad = at::ones({3}, at::kFloat).set_requires_grad(true);
  at::Tensor with_grad = at::ones({2}, at::kFloat).set_requires_grad(true);
  with_grad.mutable_grad() = at::full({2}, 0.25, at::kFloat);
  std::optional<at::Tensor> optional_tensor = at::arange(3, at::kShort);
  std::optional<at::Tensor> optional_empty;
  at::Tensor complex = at::complex(at::tensor({1.0f, -0.5f}), at::tensor({2.0f, 0.0f}));
  at::Tensor uint8 = at::arange(250, 256, at::kByte);
  at::Tensor long_vector = at::arange(100, at::kFloat);
  at::Tensor meta = at::empty({2, 3}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));

  // A CUDA tensor without CUDA: only the metadata says where the data lives,
  // which is all the printer may look at.
  static float fake_device_memory[4] = {1, 2, 3, 4};
  at::Tensor cuda = at::for_blob(fake_device_memory, {4})
                        .options(at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0))
                        .target_device(c10::Device(at::kCUDA, 0))
                        .make_tensor();

  at::Tensor symbolic = at::empty({0}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
  {
    c10::SymInt s0(c10::SymNode(c10::make_intrusive<FixtureSymNode>(4)));
    std::vector<c10::SymInt> sizes{s0, c10::SymInt(3)};
    std::vector<c10::SymInt> strides{c10::SymInt(3), c10::SymInt(1)};
    symbolic.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, c10::SymInt(0));
  }

  at::IntArrayRef int_array_ref = contiguous_float.sizes();
  c10::SmallVector<int64_t, 5> small_vector{4, 5, 6};
  c10::Device cpu_device(at::kCPU);
  c10::Device cuda_device(at::kCUDA, 1);
  c10::ScalarType scalar_type = at::kBFloat16;
  caffe2::TypeMeta type_meta = caffe2::TypeMeta::Make<double>();
  c10::SymInt sym_int(42);
  c10::Storage storage = contiguous_float.storage();
  c10::TensorImpl* impl_pointer = contiguous_float.unsafeGetTensorImpl();

  // Garbage: what an uninitialised local or a freed tensor may hold.
  alignas(at::Tensor) unsigned char garbage_bytes[sizeof(at::Tensor)];
  std::memset(garbage_bytes, 0xa5, sizeof(garbage_bytes));
  auto& garbage_tensor = *reinterpret_cast<at::Tensor*>(garbage_bytes);
  alignas(c10::TensorImpl) static unsigned char garbage_impl_bytes[sizeof(c10::TensorImpl)];
  std::memset(garbage_impl_bytes, 0x7f, sizeof(garbage_impl_bytes));
  auto* garbage_impl = reinterpret_cast<c10::TensorImpl*>(garbage_impl_bytes);

  void* const cases[] = {
      &contiguous_float,
      &transposed,
      &sliced,
      &bf16,
      &fp16,
      &int64,
      &boolean,
      &scalar,
      &empty,
      &undefined,
      &seven_dim,
      &requires_grad,
      &with_grad,
      &optional_tensor,
      &optional_empty,
      &complex,
      &uint8,
      &long_vector,
      &meta,
      &cuda,
      &symbolic,
      &int_array_ref,
      &small_vector,
      &cpu_device,
      &cuda_device,
      &scalar_type,
      &type_meta,
      &sym_int,
      &storage,
      &impl_pointer,
      &garbage_tensor,
      &garbage_impl,
  };
  fixture_stop(cases, static_cast<int>(sizeof(cases) / sizeof(cases[0])));
  std::printf("%s\n", contiguous_float.sum().item<float>() == 15.0f ? "ok" : "wrong");
  return 0;
}
