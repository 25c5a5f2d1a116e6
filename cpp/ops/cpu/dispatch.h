#pragma once
// Run-time choice among the per-CPU-capability builds of a kernel. A kernel
// file cpp/ops/cpu/<op>_kernel.cpp is compiled once per capability (see
// cmake/FuseopsCpuKernels.cmake). Each build registers its entry point in a
// CpuKernelTable with FUSEOPS_REGISTER_CPU_KERNEL. The tables are members of
// the family's `<Op>CpuKernels` (ops_generated/cpu/<op>.h, generated from
// cpp/ops/<op>.yaml), which the family's registrations call
// (`Kernels::forward()`): that returns the build matching the selected
// capability.

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Config.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

// Kernel files (compiled with CPU_CAPABILITY defined) parallelise with
// at::parallel_for, which only splits work in code compiled with OpenMP when
// ATen uses OpenMP; without it every kernel would silently run on one thread.
#if defined(CPU_CAPABILITY) && AT_PARALLEL_OPENMP && !defined(_OPENMP)
#error "fuseops CPU kernels must be compiled with OpenMP (ATen parallelises with it)"
#endif

namespace fuseops::cpu {

enum class CpuCapability : int { DEFAULT = 0, AVX2 = 1, AVX512 = 2 };
inline constexpr int kNumCpuCapabilities = 3;

const char* capability_name(CpuCapability capability);

// Capabilities this library was compiled for, lowest first.
std::vector<CpuCapability> compiled_capabilities();

// Compiled capabilities this CPU can execute (from CPUID), lowest first.
std::vector<CpuCapability> runnable_capabilities();

// How many times a kernel of each build has been picked in this process, so
// that tests can prove which builds they ran (a test that meant to run the
// AVX512 build but silently ran another would otherwise pass).
void count_kernel_call(CpuCapability capability);
std::array<uint64_t, kNumCpuCapabilities> kernel_calls();

// Whether the test switch `variable` (FUSEOPS_DISABLE_AVX512_VNNI,
// FUSEOPS_DISABLE_AVX512_BF16) is set to anything but "" or "0": it turns an
// instruction set's paths off on a CPU that has it, so that the AVX-512
// paths without it run in the test suite there too.
bool disabled_by_test_switch(const char* variable);

// The capability kernels run with: ATen's choice (`at::get_cpu_capability()`,
// which honours ATEN_CPU_CAPABILITY), lowered to what this CPU supports and
// what was compiled, unless a test override is active.
CpuCapability selected_capability();

// Forces kernels to run a given build, one of runnable_capabilities()
// (anything else throws, naming those); std::nullopt restores the normal
// choice. For tests that exercise every build inside one process.
void set_capability_override(std::optional<CpuCapability> capability);

class ScopedCapabilityOverride {
 public:
  explicit ScopedCapabilityOverride(CpuCapability capability) {
    set_capability_override(capability);
  }
  ~ScopedCapabilityOverride() { set_capability_override(std::nullopt); }
  ScopedCapabilityOverride(const ScopedCapabilityOverride&) = delete;
  ScopedCapabilityOverride& operator=(const ScopedCapabilityOverride&) = delete;
};

template <typename Fn>
class CpuKernelTable {
 public:
  explicit constexpr CpuKernelTable(const char* name) : name_(name) {}

  void set(CpuCapability capability, Fn fn) { kernels_[static_cast<int>(capability)] = fn; }

  // The build for the selected capability, falling back to the best lower
  // one that was registered.
  Fn get() const {
    for (int cap = static_cast<int>(selected_capability()); cap >= 0; --cap) {
      if (kernels_[cap] != nullptr) {
        count_kernel_call(static_cast<CpuCapability>(cap));
        return kernels_[cap];
      }
    }
    TORCH_CHECK(false, "fuseops: no CPU kernel registered for ", name_);
  }
  // `Kernels::forward()` reads the same for a CPU table and a CUDA family's
  // static function.
  Fn operator()() const { return get(); }

 private:
  const char* name_;
  // Constant-initialised (the tables are declared `inline constinit`), so
  // registrations from other translation units, which run as dynamic
  // initialisers, are safe whatever their order; `inline` makes the header's
  // table one object, shared by the registration and every kernel build.
  std::array<Fn, kNumCpuCapabilities> kernels_{};
};

}  // namespace fuseops::cpu

// Registers this capability's build of `fn` in `table`; use at namespace
// scope of a file compiled by fuseops_add_cpu_kernel.
#define FUSEOPS_REGISTER_CPU_KERNEL(table, fn)                               \
  static const bool C10_ANONYMOUS_VARIABLE(fuseops_cpu_kernel_registered_) = \
      (table.set(::fuseops::cpu::CpuCapability::CPU_CAPABILITY, fn), true)
