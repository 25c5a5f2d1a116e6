// fuseops._C bindings of the int4 linear ops (cpp/include/fuseops/int4_linear.h).

#include <fuseops/int4_linear.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(int4_linear) {
  m.def("quantize_per_group_int4", &fuseops::quantize_per_group_int4, py::arg("weight"),
        py::arg("group_size") = 128, py::arg("symmetric") = true);
  m.def("pack_int4_weight", &fuseops::pack_int4_weight, py::arg("wq"), py::arg("scale"),
        py::arg("zero"), py::arg("group_size"));
  m.def("int4_weight_only_linear", &fuseops::int4_weight_only_linear, py::arg("input"),
        py::arg("packed"), py::arg("scale_zero"), py::arg("group_size"),
        py::arg("bias") = py::none());
  m.def("int4_dynamic_linear", &fuseops::int4_dynamic_linear, py::arg("input"), py::arg("packed"),
        py::arg("scale_zero"), py::arg("group_size"), py::arg("bias") = py::none());
}
