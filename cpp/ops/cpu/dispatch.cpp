#include "ops/cpu/dispatch.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <ATen/Version.h>

namespace fuseops::cpu {
namespace {

// -1 means no override.
std::atomic<int> capability_override{-1};

std::array<std::atomic<uint64_t>, kNumCpuCapabilities> kernel_call_counts{};

CpuCapability best_compiled() { return compiled_capabilities().back(); }

// What this CPU can execute, independent of ATen's preference.
CpuCapability hardware_capability() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return CpuCapability::AVX512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return CpuCapability::AVX2;
  }
#endif
  return CpuCapability::DEFAULT;
}

CpuCapability lowest(CpuCapability a, CpuCapability b) {
  return static_cast<int>(a) < static_cast<int>(b) ? a : b;
}

CpuCapability aten_capability() {
  const std::string name = at::get_cpu_capability();
  if (name == "AVX512") {
    return CpuCapability::AVX512;
  }
  if (name == "AVX2") {
    return CpuCapability::AVX2;
  }
  return CpuCapability::DEFAULT;
}

}  // namespace

bool disabled_by_test_switch(const char* variable) {
  const char* value = std::getenv(variable);
  return value != nullptr && std::strcmp(value, "") != 0 && std::strcmp(value, "0") != 0;
}

const char* capability_name(CpuCapability capability) {
  switch (capability) {
    case CpuCapability::DEFAULT:
      return "DEFAULT";
    case CpuCapability::AVX2:
      return "AVX2";
    case CpuCapability::AVX512:
      return "AVX512";
  }
  return "UNKNOWN";
}

std::vector<CpuCapability> compiled_capabilities() {
  std::vector<CpuCapability> capabilities;
#ifdef FUSEOPS_HAVE_CPU_DEFAULT
  capabilities.push_back(CpuCapability::DEFAULT);
#endif
#ifdef FUSEOPS_HAVE_CPU_AVX2
  capabilities.push_back(CpuCapability::AVX2);
#endif
#ifdef FUSEOPS_HAVE_CPU_AVX512
  capabilities.push_back(CpuCapability::AVX512);
#endif
  return capabilities;
}

std::vector<CpuCapability> runnable_capabilities() {
  std::vector<CpuCapability> capabilities;
  for (auto capability : compiled_capabilities()) {
    if (static_cast<int>(capability) <= static_cast<int>(hardware_capability())) {
      capabilities.push_back(capability);
    }
  }
  return capabilities;
}

void count_kernel_call(CpuCapability capability) {
  kernel_call_counts[static_cast<int>(capability)].fetch_add(1, std::memory_order_relaxed);
}

std::array<uint64_t, kNumCpuCapabilities> kernel_calls() {
  std::array<uint64_t, kNumCpuCapabilities> calls{};
  for (int cap = 0; cap < kNumCpuCapabilities; ++cap) {
    calls[cap] = kernel_call_counts[cap].load(std::memory_order_relaxed);
  }
  return calls;
}

CpuCapability selected_capability() {
  static const CpuCapability normal_choice =
      lowest(lowest(aten_capability(), hardware_capability()), best_compiled());
  const int forced = capability_override.load(std::memory_order_relaxed);
  if (forced >= 0) {
    return static_cast<CpuCapability>(forced);
  }
  return normal_choice;
}

void set_capability_override(std::optional<CpuCapability> capability) {
  if (capability) {
    // Lowering it silently would let a test that means one build run
    // another and pass.
    const auto runnable = runnable_capabilities();
    if (std::find(runnable.begin(), runnable.end(), *capability) == runnable.end()) {
      const auto compiled = compiled_capabilities();
      const bool is_compiled =
          std::find(compiled.begin(), compiled.end(), *capability) != compiled.end();
      std::string names;
      for (auto cap : runnable) {
        names += names.empty() ? "" : ", ";
        names += capability_name(cap);
      }
      TORCH_CHECK(false, "fuseops: cannot force the ", capability_name(*capability),
                  " CPU kernels: ",
                  is_compiled ? "this CPU cannot execute them"
                              : "this build of fuseops does not include them "
                                "(FUSEOPS_CPU_CAPABILITIES)",
                  ". Force one of fuseops::cpu::runnable_capabilities() (here: ", names, ").");
    }
  }
  capability_override.store(capability ? static_cast<int>(*capability) : -1,
                            std::memory_order_relaxed);
}

}  // namespace fuseops::cpu
