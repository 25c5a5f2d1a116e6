// fuseops._C bindings of moe_experts (cpp/include/fuseops/moe_experts.h).

#include <fuseops/moe_experts.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(moe_experts) {
  m.def("moe_experts", &fuseops::moe_experts, py::arg("hidden"), py::arg("top_k_index"),
        py::arg("top_k_weights"), py::arg("gate_up_proj"), py::arg("down_proj"),
        py::arg("activation") = "silu");
  m.def("moe_experts_forward", &fuseops::moe_experts_forward, py::arg("hidden"),
        py::arg("top_k_index"), py::arg("top_k_weights"), py::arg("gate_up_proj"),
        py::arg("down_proj"), py::arg("activation") = "silu");
  m.def("moe_experts_backward", &fuseops::moe_experts_backward, py::arg("grad_output"),
        py::arg("hidden"), py::arg("top_k_index"), py::arg("top_k_weights"),
        py::arg("gate_up_proj"), py::arg("down_proj"), py::arg("activation") = "silu",
        py::arg("expert_grads") = true, py::arg("gate_up_out") = py::none());
}
