// fuseops._C bindings of the int8 quantization ops (cpp/include/fuseops/quantize.h).

#include <fuseops/quantize.h>

#include "bindings.h"

namespace py = pybind11;

FUSEOPS_PYTHON_BINDINGS(quantize) {
  m.def("quantize_per_channel_int8", &fuseops::quantize_per_channel_int8, py::arg("weight"));
  m.def("quantize_per_token_int8", &fuseops::quantize_per_token_int8, py::arg("input"));
  m.def("dequantize_int8", &fuseops::dequantize_int8, py::arg("q"), py::arg("scale"),
        py::arg("dim") = -1, py::arg("dtype") = py::none());
}
