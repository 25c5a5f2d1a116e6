// fuseops._C bindings of the 2:4 sparse ops (cpp/include/fuseops/sparse_2_4.h).

#include <fuseops/sparse_2_4.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(sparse_2_4) {
  m.def("prune_2_4", &fuseops::prune_2_4, py::arg("weight"));
  m.def("pack_2_4", &fuseops::pack_2_4, py::arg("weight"), py::arg("scale") = py::none());
  m.def("sparse_2_4_linear", &fuseops::sparse_2_4_linear, py::arg("input"), py::arg("values"),
        py::arg("meta"), py::arg("scale"), py::arg("bias") = py::none());
  m.def("sparse_2_4_dynamic_linear", &fuseops::sparse_2_4_dynamic_linear, py::arg("input"),
        py::arg("values"), py::arg("meta"), py::arg("scale"), py::arg("colsum"),
        py::arg("bias") = py::none());
}
