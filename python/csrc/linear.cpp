// fuseops._C binding of linear (cpp/include/fuseops/linear.h).

#include <fuseops/linear.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(linear) {
  m.def("linear", &fuseops::linear, py::arg("input"), py::arg("weight"),
        py::arg("bias") = py::none());
}
