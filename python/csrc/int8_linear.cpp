// fuseops._C bindings of the int8 linear ops (cpp/include/fuseops/int8_linear.h).

#include <fuseops/int8_linear.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(int8_linear) {
  m.def("pack_int8_weight", &fuseops::pack_int8_weight, py::arg("wq"), py::arg("scale"));
  m.def("int8_weight_only_linear", &fuseops::int8_weight_only_linear, py::arg("input"),
        py::arg("packed"), py::arg("scale"), py::arg("bias") = py::none());
  m.def("int8_dynamic_linear", &fuseops::int8_dynamic_linear, py::arg("input"), py::arg("packed"),
        py::arg("scale"), py::arg("colsum"), py::arg("bias") = py::none());
}
