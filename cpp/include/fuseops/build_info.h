#pragma once

#include <string>
#include <vector>

namespace fuseops {

// How this libfuseops was built, and what it runs with.
struct BuildInfo {
  std::string version;                          // fuseops version
  std::string torch_version;                    // torch it was compiled against
  bool cxx11_abi;                               // _GLIBCXX_USE_CXX11_ABI
  std::vector<std::string> cpu_capabilities;    // compiled kernel builds
  std::string selected_cpu_capability;          // the build kernels run now
  bool cuda;                                    // CUDA kernels compiled in
  std::string cuda_version;                     // CUDA toolkit, "" without CUDA
  std::vector<std::string> cuda_architectures;  // e.g. {"9.0"}
};

BuildInfo build_info();

}  // namespace fuseops
