#include <fuseops/build_info.h>

#include <sstream>

#include "ops/cpu/dispatch.h"

// FUSEOPS_VERSION, FUSEOPS_TORCH_VERSION (torch.__version__ at build time),
// FUSEOPS_CUDA_VERSION and FUSEOPS_CUDA_ARCHITECTURES
// ("9.0;10.0") come from CMake; FUSEOPS_WITH_CUDA is defined when the CUDA
// kernels are compiled in.

namespace fuseops {
namespace {

[[maybe_unused]] std::vector<std::string> split(const std::string& list, char separator) {
  std::vector<std::string> items;
  std::stringstream stream(list);
  std::string item;
  while (std::getline(stream, item, separator)) {
    if (!item.empty()) {
      items.push_back(item);
    }
  }
  return items;
}

}  // namespace

BuildInfo build_info() {
  BuildInfo info;
  info.version = FUSEOPS_VERSION;
  info.torch_version = FUSEOPS_TORCH_VERSION;
  info.cxx11_abi = _GLIBCXX_USE_CXX11_ABI != 0;
  for (auto capability : cpu::compiled_capabilities()) {
    info.cpu_capabilities.emplace_back(cpu::capability_name(capability));
  }
  for (auto capability : cpu::runnable_capabilities()) {
    info.runnable_cpu_capabilities.emplace_back(cpu::capability_name(capability));
  }
  info.selected_cpu_capability = cpu::capability_name(cpu::selected_capability());
#ifdef FUSEOPS_WITH_CUDA
  info.cuda = true;
  info.cuda_version = FUSEOPS_CUDA_VERSION;
  info.cuda_architectures = split(FUSEOPS_CUDA_ARCHITECTURES, ';');
  info.cuda_status =
      "experimental: every op's CUDA kernel compiles and registers; one run on an H200 passed "
      "4600 of 4633 CUDA tests, and the fixes for the rest are not yet verified on a GPU; "
      "verify on your GPU with `bash tools/gpu_check.sh` (cuda/README.md)";
#else
  info.cuda = false;
#endif
  return info;
}

std::vector<std::pair<std::string, uint64_t>> cpu_kernel_calls() {
  const auto calls = cpu::kernel_calls();
  std::vector<std::pair<std::string, uint64_t>> named;
  for (auto capability : cpu::compiled_capabilities()) {
    named.emplace_back(cpu::capability_name(capability), calls[static_cast<int>(capability)]);
  }
  return named;
}

}  // namespace fuseops
