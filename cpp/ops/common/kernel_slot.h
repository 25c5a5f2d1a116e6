#pragma once
// One kernel of a backend that has a single build of each (CUDA), filled by
// the backend's kernel file at static initialisation and read at call time.
// The CPU keeps one per capability instead (CpuKernelTable, ops/cpu/dispatch.h).

#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

namespace fuseops::detail {

template <typename Fn>
class KernelSlot {
 public:
  explicit constexpr KernelSlot(const char* name) : name_(name) {}

  void set(Fn fn) { fn_ = fn; }

  // `Kernels::forward()` reads the same as for a CPU table.
  Fn operator()() const {
    TORCH_CHECK(fn_ != nullptr, "fuseops: no kernel registered for ", name_);
    return fn_;
  }

 private:
  const char* name_;
  // Constant-initialised (declared `inline constinit`): the kernel file's
  // registration may run before or after the dispatcher's, in any order.
  Fn fn_ = nullptr;
};

}  // namespace fuseops::detail

// Registers `fn` in `slot`; use at namespace scope of the backend's kernel file.
#define FUSEOPS_REGISTER_KERNEL(slot, fn) \
  static const bool C10_ANONYMOUS_VARIABLE(fuseops_kernel_registered_) = (slot.set(fn), true)
