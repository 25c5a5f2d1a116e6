// fuseops._C bindings of gelu, silu and bias_gelu (cpp/include/fuseops/activation.h).

#include <fuseops/activation.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(activation) {
  m.def("gelu", &fuseops::gelu, py::arg("input"), py::arg("approximate") = "none");
  m.def("gelu_out", &fuseops::gelu_out, py::arg("input"), py::arg("approximate"), py::arg("out"));
  m.def("gelu_backward", &fuseops::gelu_backward, py::arg("grad_output"), py::arg("input"),
        py::arg("approximate") = "none");
  m.def("gelu_backward_out", &fuseops::gelu_backward_out, py::arg("grad_output"), py::arg("input"),
        py::arg("approximate"), py::arg("out"));
  m.def("silu", &fuseops::silu, py::arg("input"));
  m.def("silu_out", &fuseops::silu_out, py::arg("input"), py::arg("out"));
  m.def("silu_backward", &fuseops::silu_backward, py::arg("grad_output"), py::arg("input"));
  m.def("silu_backward_out", &fuseops::silu_backward_out, py::arg("grad_output"), py::arg("input"),
        py::arg("out"));
  m.def("bias_gelu", &fuseops::bias_gelu, py::arg("input"), py::arg("bias"),
        py::arg("approximate") = "none");
  m.def("bias_gelu_out", &fuseops::bias_gelu_out, py::arg("input"), py::arg("bias"),
        py::arg("approximate"), py::arg("out"));
  m.def("bias_gelu_backward", &fuseops::bias_gelu_backward, py::arg("grad_output"),
        py::arg("input"), py::arg("bias"), py::arg("approximate") = "none");
  m.def("bias_gelu_backward_out", &fuseops::bias_gelu_backward_out, py::arg("grad_output"),
        py::arg("input"), py::arg("bias"), py::arg("approximate"), py::arg("grad_input"),
        py::arg("grad_bias"));
}
