// fuseops._C bindings of rms_norm and fused_add_rms_norm
// (cpp/include/fuseops/rms_norm.h).

#include <optional>

#include <fuseops/rms_norm.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(rms_norm) {
  m.def("rms_norm", &fuseops::rms_norm, py::arg("input"), py::arg("weight") = py::none(),
        py::arg("eps") = py::none());
  m.def("rms_norm_out", &fuseops::rms_norm_out, py::arg("input"), py::arg("weight"), py::arg("eps"),
        py::arg("out"));
  m.def("rms_norm_forward", &fuseops::rms_norm_forward, py::arg("input"),
        py::arg("weight") = py::none(), py::arg("eps") = py::none());
  m.def("rms_norm_backward", &fuseops::rms_norm_backward, py::arg("grad_output"), py::arg("input"),
        py::arg("weight"), py::arg("rstd"));
  m.def("rms_norm_backward_out", &fuseops::rms_norm_backward_out, py::arg("grad_output"),
        py::arg("input"), py::arg("weight"), py::arg("rstd"), py::arg("grad_input"),
        py::arg("grad_weight"));
  m.def("fused_add_rms_norm", &fuseops::fused_add_rms_norm, py::arg("input"), py::arg("residual"),
        py::arg("weight") = py::none(), py::arg("eps") = py::none());
  m.def(
      "fused_add_rms_norm_out",
      [](const at::Tensor& input, const at::Tensor& residual,
         const std::optional<at::Tensor>& weight, std::optional<double> eps, at::Tensor& out,
         at::Tensor& residual_out) {
        fuseops::fused_add_rms_norm_out(input, residual, weight, eps, out, residual_out);
        return py::make_tuple(out, residual_out);
      },
      py::arg("input"), py::arg("residual"), py::arg("weight"), py::arg("eps"), py::arg("out"),
      py::arg("residual_out"));
  m.def("fused_add_rms_norm_forward", &fuseops::fused_add_rms_norm_forward, py::arg("input"),
        py::arg("residual"), py::arg("weight") = py::none(), py::arg("eps") = py::none());
  m.def("fused_add_rms_norm_backward", &fuseops::fused_add_rms_norm_backward,
        py::arg("grad_output"), py::arg("grad_new_residual"), py::arg("new_residual"),
        py::arg("weight"), py::arg("rstd"));
  m.def("fused_add_rms_norm_backward_out", &fuseops::fused_add_rms_norm_backward_out,
        py::arg("grad_output"), py::arg("grad_new_residual"), py::arg("new_residual"),
        py::arg("weight"), py::arg("rstd"), py::arg("grad_input"), py::arg("grad_weight"));
}
