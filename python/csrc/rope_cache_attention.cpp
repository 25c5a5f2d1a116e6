// fuseops._C binding of rope_cache_attention (cpp/include/fuseops/rope_cache_attention.h).

#include <fuseops/rope_cache_attention.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(rope_cache_attention) {
  m.def("rope_cache_attention", &fuseops::rope_cache_attention, py::arg("query"), py::arg("key"),
        py::arg("value"), py::arg("cos"), py::arg("sin"), py::arg("key_cache"),
        py::arg("value_cache"), py::arg("cache_length"), py::arg("attn_mask") = py::none(),
        py::arg("scale") = py::none(), py::arg("softcap") = 0.0, py::arg("interleaved") = false);
}
