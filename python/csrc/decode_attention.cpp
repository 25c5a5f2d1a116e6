// fuseops._C binding of decode_attention (cpp/include/fuseops/decode_attention.h).

#include <fuseops/decode_attention.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(decode_attention) {
  m.def("decode_attention", &fuseops::decode_attention, py::arg("query"), py::arg("key"),
        py::arg("value"), py::arg("attn_mask") = py::none(), py::arg("is_causal") = false,
        py::arg("scale") = py::none(), py::arg("softcap") = 0.0);
}
