// fuseops._C: the C++ API (cpp/include/fuseops) bound for Python, plus build
// information. The public Python functions go through torch.ops instead
// (visible to torch.compile/export); these bindings exist so that the C++ API
// itself can be called and tested from Python. Each op's functions are bound
// in python/csrc/<op>.cpp (see bindings.h).

#include <vector>

#include <fuseops/build_info.h>
#include <fuseops/memory.h>

#include "bindings.h"

namespace py = pybind11;

namespace fuseops::python {
namespace {

// A function-local static: registrations run from other files' static
// initialisers, in an order the language leaves open.
std::vector<Bindings>& registered() {
  static std::vector<Bindings> bindings;
  return bindings;
}

}  // namespace

bool add_bindings(Bindings bindings) {
  registered().push_back(bindings);
  return true;
}

void bind_all(py::module_& m) {
  for (Bindings bindings : registered()) {
    bindings(m);
  }
}

}  // namespace fuseops::python

PYBIND11_MODULE(_C, m) {
  m.doc() = "fuseops C++ API bindings";

  fuseops::python::bind_all(m);

  m.def("build_info", [] {
    const fuseops::BuildInfo info = fuseops::build_info();
    py::dict d;
    d["version"] = info.version;
    d["torch_version"] = info.torch_version;
    d["cxx11_abi"] = info.cxx11_abi;
    d["cpu_capabilities"] = info.cpu_capabilities;
    d["runnable_cpu_capabilities"] = info.runnable_cpu_capabilities;
    d["selected_cpu_capability"] = info.selected_cpu_capability;
    d["cuda"] = info.cuda;
    d["cuda_version"] = info.cuda_version;
    d["cuda_architectures"] = info.cuda_architectures;
    d["cuda_status"] = info.cuda_status;
    return d;
  });
  m.def("output_memory_stats", [] {
    const fuseops::OutputMemoryStats stats = fuseops::output_memory_stats();
    py::dict d;
    d["allocations"] = stats.allocations;
    d["cache_hits"] = stats.cache_hits;
    d["huge_page_advised"] = stats.huge_page_advised;
    d["bytes_in_use"] = stats.bytes_in_use;
    d["bytes_cached"] = stats.bytes_cached;
    d["cache_limit"] = stats.cache_limit;
    return d;
  });
  m.def("set_output_cache_limit", &fuseops::set_output_cache_limit, py::arg("bytes"));
  m.def("release_cached_output_memory", &fuseops::release_cached_output_memory);
  m.def("set_output_huge_pages", &fuseops::set_output_huge_pages, py::arg("enabled"));
  m.def("cpu_kernel_calls", [] {
    py::dict d;
    for (const auto& [capability, calls] : fuseops::cpu_kernel_calls()) {
      d[py::str(capability)] = calls;
    }
    return d;
  });
}
