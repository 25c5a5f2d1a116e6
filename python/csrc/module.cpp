// fuseops._C: the C++ API (cpp/include/fuseops) bound for Python, plus build
// information. The public Python functions go through torch.ops instead
// (visible to torch.compile/export); these bindings exist so that the C++ API
// itself can be called and tested from Python.

#include <torch/csrc/utils/pybind.h>

#include <fuseops/fuseops.h>

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "fuseops C++ API bindings";

  m.def("relu", &fuseops::relu, py::arg("input"));
  m.def("relu_out", &fuseops::relu_out, py::arg("input"), py::arg("out"));
  m.def("relu_backward", &fuseops::relu_backward, py::arg("grad_output"),
        py::arg("result"));

  m.def("build_info", [] {
    const fuseops::BuildInfo info = fuseops::build_info();
    py::dict d;
    d["version"] = info.version;
    d["torch_version"] = info.torch_version;
    d["cxx11_abi"] = info.cxx11_abi;
    d["cpu_capabilities"] = info.cpu_capabilities;
    d["selected_cpu_capability"] = info.selected_cpu_capability;
    d["cuda"] = info.cuda;
    d["cuda_version"] = info.cuda_version;
    d["cuda_architectures"] = info.cuda_architectures;
    return d;
  });
}
