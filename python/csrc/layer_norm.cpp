// fuseops._C bindings of layer_norm (cpp/include/fuseops/layer_norm.h).

#include <fuseops/layer_norm.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(layer_norm) {
  m.def("layer_norm", &fuseops::layer_norm, py::arg("input"), py::arg("weight") = py::none(),
        py::arg("bias") = py::none(), py::arg("eps") = 1e-5);
  m.def("layer_norm_out", &fuseops::layer_norm_out, py::arg("input"), py::arg("weight"),
        py::arg("bias"), py::arg("eps"), py::arg("out"));
  m.def("layer_norm_forward", &fuseops::layer_norm_forward, py::arg("input"),
        py::arg("weight") = py::none(), py::arg("bias") = py::none(), py::arg("eps") = 1e-5);
  m.def("layer_norm_backward", &fuseops::layer_norm_backward, py::arg("grad_output"),
        py::arg("input"), py::arg("weight"), py::arg("mean"), py::arg("rstd"));
  m.def("layer_norm_backward_out", &fuseops::layer_norm_backward_out, py::arg("grad_output"),
        py::arg("input"), py::arg("weight"), py::arg("mean"), py::arg("rstd"),
        py::arg("grad_input"), py::arg("grad_weight"), py::arg("grad_bias"));
}
