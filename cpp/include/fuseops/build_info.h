#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fuseops {

// How this libfuseops was built, and what it runs with.
struct BuildInfo {
  std::string version;                                 // fuseops version
  std::string torch_version;                           // torch it was compiled against
  bool cxx11_abi;                                      // _GLIBCXX_USE_CXX11_ABI
  std::vector<std::string> cpu_capabilities;           // compiled kernel builds
  std::vector<std::string> runnable_cpu_capabilities;  // those this CPU executes
  std::string selected_cpu_capability;                 // the build kernels run now
  bool cuda;                                           // CUDA kernels compiled in
  std::string cuda_version;                            // CUDA toolkit, "" without CUDA
  std::vector<std::string> cuda_architectures;         // e.g. {"9.0"}
  // What the CUDA kernels have been shown to do ("" without CUDA): until
  // tools/gpu_check.sh has passed on a GPU they are compiled and registered
  // but unverified, and this says so with the command that verifies them.
  std::string cuda_status;
};

BuildInfo build_info();

// How many CPU kernel calls each build (DEFAULT, AVX2, AVX512) has run in
// this process: shows which builds a program, or a test, really exercised.
std::vector<std::pair<std::string, uint64_t>> cpu_kernel_calls();

}  // namespace fuseops
