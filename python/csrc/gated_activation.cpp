// fuseops._C bindings of swiglu and geglu (cpp/include/fuseops/gated_activation.h).

#include <fuseops/gated_activation.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(gated_activation) {
  m.def("swiglu", &fuseops::swiglu, py::arg("gate"), py::arg("up"));
  m.def("swiglu_out", &fuseops::swiglu_out, py::arg("gate"), py::arg("up"), py::arg("out"));
  m.def("swiglu_backward", &fuseops::swiglu_backward, py::arg("grad_output"), py::arg("gate"),
        py::arg("up"));
  m.def("swiglu_backward_out", &fuseops::swiglu_backward_out, py::arg("grad_output"),
        py::arg("gate"), py::arg("up"), py::arg("grad_gate"), py::arg("grad_up"));
  m.def("swiglu_packed", &fuseops::swiglu_packed, py::arg("input"));
  m.def("swiglu_packed_out", &fuseops::swiglu_packed_out, py::arg("input"), py::arg("out"));
  m.def("swiglu_packed_backward", &fuseops::swiglu_packed_backward, py::arg("grad_output"),
        py::arg("input"));
  m.def("geglu", &fuseops::geglu, py::arg("gate"), py::arg("up"), py::arg("approximate") = "none");
  m.def("geglu_out", &fuseops::geglu_out, py::arg("gate"), py::arg("up"), py::arg("approximate"),
        py::arg("out"));
  m.def("geglu_backward", &fuseops::geglu_backward, py::arg("grad_output"), py::arg("gate"),
        py::arg("up"), py::arg("approximate") = "none");
  m.def("geglu_backward_out", &fuseops::geglu_backward_out, py::arg("grad_output"), py::arg("gate"),
        py::arg("up"), py::arg("approximate"), py::arg("grad_gate"), py::arg("grad_up"));
  m.def("geglu_packed", &fuseops::geglu_packed, py::arg("input"), py::arg("approximate") = "none");
  m.def("geglu_packed_out", &fuseops::geglu_packed_out, py::arg("input"), py::arg("approximate"),
        py::arg("out"));
  m.def("geglu_packed_backward", &fuseops::geglu_packed_backward, py::arg("grad_output"),
        py::arg("input"), py::arg("approximate") = "none");
}
