// fuseops._C bindings of rope (cpp/include/fuseops/rope.h).

#include <optional>

#include <fuseops/rope.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(rope) {
  m.def("rope", &fuseops::rope, py::arg("query"), py::arg("key"), py::arg("cos"), py::arg("sin"),
        py::arg("positions") = py::none(), py::arg("interleaved") = false);
  m.def("rope_single", &fuseops::rope_single, py::arg("input"), py::arg("cos"), py::arg("sin"),
        py::arg("positions") = py::none(), py::arg("interleaved") = false);
  m.def(
      "rope_out",
      [](const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos,
         const at::Tensor& sin, const std::optional<at::Tensor>& positions, bool interleaved,
         at::Tensor& out, at::Tensor& key_out) {
        fuseops::rope_out(query, key, cos, sin, positions, interleaved, out, key_out);
        return py::make_tuple(out, key_out);
      },
      py::arg("query"), py::arg("key"), py::arg("cos"), py::arg("sin"), py::arg("positions"),
      py::arg("interleaved"), py::arg("out"), py::arg("key_out"));
  m.def("rope_single_out", &fuseops::rope_single_out, py::arg("input"), py::arg("cos"),
        py::arg("sin"), py::arg("positions"), py::arg("interleaved"), py::arg("out"));
  m.def(
      "rope_",
      [](at::Tensor& query, at::Tensor& key, const at::Tensor& cos, const at::Tensor& sin,
         const std::optional<at::Tensor>& positions, bool interleaved) {
        fuseops::rope_(query, key, cos, sin, positions, interleaved);
        return py::make_tuple(query, key);
      },
      py::arg("query"), py::arg("key"), py::arg("cos"), py::arg("sin"),
      py::arg("positions") = py::none(), py::arg("interleaved") = false);
  m.def("rope_backward", &fuseops::rope_backward, py::arg("grad_query"), py::arg("grad_key"),
        py::arg("cos"), py::arg("sin"), py::arg("positions") = py::none(),
        py::arg("interleaved") = false);
  m.def("rope_single_backward", &fuseops::rope_single_backward, py::arg("grad_input"),
        py::arg("cos"), py::arg("sin"), py::arg("positions") = py::none(),
        py::arg("interleaved") = false);
  m.def(
      "rope_backward_out",
      [](const at::Tensor& grad_query, const at::Tensor& grad_key, const at::Tensor& cos,
         const at::Tensor& sin, const std::optional<at::Tensor>& positions, bool interleaved,
         at::Tensor& out, at::Tensor& key_out) {
        fuseops::rope_backward_out(grad_query, grad_key, cos, sin, positions, interleaved, out,
                                   key_out);
        return py::make_tuple(out, key_out);
      },
      py::arg("grad_query"), py::arg("grad_key"), py::arg("cos"), py::arg("sin"),
      py::arg("positions"), py::arg("interleaved"), py::arg("out"), py::arg("key_out"));
  m.def("rope_backward_single_out", &fuseops::rope_backward_single_out, py::arg("grad_input"),
        py::arg("cos"), py::arg("sin"), py::arg("positions"), py::arg("interleaved"),
        py::arg("out"));
}
