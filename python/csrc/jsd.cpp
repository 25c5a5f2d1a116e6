// fuseops._C bindings of jsd, kl_div and fused_linear_jsd (cpp/include/fuseops/jsd.h).

#include <fuseops/jsd.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(jsd) {
  m.def("jsd", &fuseops::jsd, py::arg("student_logits"), py::arg("teacher_logits"),
        py::arg("label") = py::none(), py::arg("beta") = 0.5, py::arg("temperature") = 1.0,
        py::arg("ignore_index") = -100, py::arg("reduction") = "batchmean");
  m.def("jsd_forward", &fuseops::jsd_forward, py::arg("student_logits"), py::arg("teacher_logits"),
        py::arg("label") = py::none(), py::arg("beta") = 0.5, py::arg("temperature") = 1.0,
        py::arg("ignore_index") = -100, py::arg("reduction") = "batchmean");
  m.def("jsd_backward", &fuseops::jsd_backward, py::arg("grad_output"), py::arg("student_logits"),
        py::arg("teacher_logits"), py::arg("label"), py::arg("row_stats"), py::arg("beta"),
        py::arg("temperature"), py::arg("ignore_index"), py::arg("reduction"));
  m.def("kl_div", &fuseops::kl_div, py::arg("student_logits"), py::arg("teacher_logits"),
        py::arg("label") = py::none(), py::arg("temperature") = 1.0, py::arg("ignore_index") = -100,
        py::arg("reduction") = "batchmean", py::arg("reverse") = false);
  m.def("fused_linear_jsd", &fuseops::fused_linear_jsd, py::arg("student_input"),
        py::arg("student_weight"), py::arg("teacher_input"), py::arg("teacher_weight"),
        py::arg("label") = py::none(), py::arg("beta") = 0.5, py::arg("temperature") = 1.0,
        py::arg("ignore_index") = -100, py::arg("reduction") = "batchmean");
  m.def("fused_linear_jsd_forward", &fuseops::fused_linear_jsd_forward, py::arg("student_input"),
        py::arg("student_weight"), py::arg("teacher_input"), py::arg("teacher_weight"),
        py::arg("label") = py::none(), py::arg("beta") = 0.5, py::arg("temperature") = 1.0,
        py::arg("ignore_index") = -100, py::arg("reduction") = "batchmean");
  m.def("fused_linear_jsd_backward", &fuseops::fused_linear_jsd_backward, py::arg("grad_output"),
        py::arg("student_input"), py::arg("student_weight"), py::arg("teacher_input"),
        py::arg("teacher_weight"), py::arg("label"), py::arg("beta"), py::arg("temperature"),
        py::arg("ignore_index"), py::arg("reduction"));
}
