// fuseops._C bindings of causal_conv1d (cpp/include/fuseops/causal_conv1d.h).

#include <fuseops/causal_conv1d.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(causal_conv1d) {
  m.def("causal_conv1d", &fuseops::causal_conv1d, py::arg("x"), py::arg("weight"),
        py::arg("bias") = py::none(), py::arg("initial_states") = py::none(),
        py::arg("activation") = py::none());
  m.def("causal_conv1d_out", &fuseops::causal_conv1d_out, py::arg("x"), py::arg("weight"),
        py::arg("bias"), py::arg("initial_states"), py::arg("activation"), py::arg("out"));
  m.def("causal_conv1d_forward", &fuseops::causal_conv1d_forward, py::arg("x"), py::arg("weight"),
        py::arg("bias") = py::none(), py::arg("initial_states") = py::none(),
        py::arg("activation") = py::none());
  m.def("causal_conv1d_backward", &fuseops::causal_conv1d_backward, py::arg("grad_output"),
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("initial_states"),
        py::arg("grad_final_states"), py::arg("activation"));
  m.def("causal_conv1d_update", &fuseops::causal_conv1d_update, py::arg("x"), py::arg("conv_state"),
        py::arg("weight"), py::arg("bias") = py::none(), py::arg("activation") = py::none());
}
