// fuseops._C bindings of cross_entropy and linear_cross_entropy
// (cpp/include/fuseops/cross_entropy.h).

#include <fuseops/cross_entropy.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(cross_entropy) {
  m.def("cross_entropy", &fuseops::cross_entropy, py::arg("logits"), py::arg("target"),
        py::arg("weight") = py::none(), py::arg("reduction") = "mean",
        py::arg("ignore_index") = -100, py::arg("label_smoothing") = 0.0, py::arg("z_loss") = 0.0,
        py::arg("softcap") = py::none());
  m.def("cross_entropy_forward", &fuseops::cross_entropy_forward, py::arg("logits"),
        py::arg("target"), py::arg("weight") = py::none(), py::arg("reduction") = "mean",
        py::arg("ignore_index") = -100, py::arg("label_smoothing") = 0.0, py::arg("z_loss") = 0.0,
        py::arg("softcap") = py::none());
  m.def("cross_entropy_backward", &fuseops::cross_entropy_backward, py::arg("grad_output"),
        py::arg("logits"), py::arg("target"), py::arg("weight"), py::arg("lse"),
        py::arg("total_weight"), py::arg("reduction"), py::arg("ignore_index"),
        py::arg("label_smoothing"), py::arg("z_loss"), py::arg("softcap"));
  m.def("cross_entropy_inplace", &fuseops::cross_entropy_inplace, py::arg("logits"),
        py::arg("target"), py::arg("weight") = py::none(), py::arg("reduction") = "mean",
        py::arg("ignore_index") = -100, py::arg("label_smoothing") = 0.0, py::arg("z_loss") = 0.0,
        py::arg("softcap") = py::none());
  m.def("linear_cross_entropy", &fuseops::linear_cross_entropy, py::arg("input"), py::arg("weight"),
        py::arg("bias"), py::arg("target"), py::arg("class_weight") = py::none(),
        py::arg("reduction") = "mean", py::arg("ignore_index") = -100,
        py::arg("label_smoothing") = 0.0, py::arg("z_loss") = 0.0, py::arg("softcap") = py::none(),
        py::arg("normalizer") = py::none());
  m.def("linear_cross_entropy_stats", &fuseops::linear_cross_entropy_stats, py::arg("input"),
        py::arg("weight"), py::arg("bias"), py::arg("target"), py::arg("class_weight") = py::none(),
        py::arg("reduction") = "mean", py::arg("ignore_index") = -100,
        py::arg("label_smoothing") = 0.0, py::arg("z_loss") = 0.0, py::arg("softcap") = py::none(),
        py::arg("normalizer") = py::none(), py::arg("predict") = false,
        py::arg("softmax_stats") = false);
  m.def("linear_cross_entropy_forward", &fuseops::linear_cross_entropy_forward, py::arg("input"),
        py::arg("weight"), py::arg("bias"), py::arg("target"), py::arg("class_weight") = py::none(),
        py::arg("reduction") = "mean", py::arg("ignore_index") = -100,
        py::arg("label_smoothing") = 0.0, py::arg("z_loss") = 0.0, py::arg("softcap") = py::none(),
        py::arg("normalizer") = py::none(), py::arg("predict") = false,
        py::arg("weight_grad") = true, py::arg("softmax_stats") = false);
  m.def("linear_cross_entropy_backward", &fuseops::linear_cross_entropy_backward,
        py::arg("grad_output"), py::arg("input"), py::arg("weight"), py::arg("bias"),
        py::arg("target"), py::arg("class_weight"), py::arg("reduction"), py::arg("ignore_index"),
        py::arg("label_smoothing"), py::arg("z_loss"), py::arg("softcap"), py::arg("normalizer"));
}
