// fuseops._C bindings of relu (cpp/include/fuseops/relu.h).

#include <fuseops/relu.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(relu) {
  m.def("relu", &fuseops::relu, py::arg("input"));
  m.def("relu_out", &fuseops::relu_out, py::arg("input"), py::arg("out"));
  m.def("relu_backward", &fuseops::relu_backward, py::arg("grad_output"), py::arg("result"));
  m.def("relu_backward_out", &fuseops::relu_backward_out, py::arg("grad_output"), py::arg("result"),
        py::arg("out"));
}
