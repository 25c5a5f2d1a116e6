#pragma once
// How an op's binding file (python/csrc/<op>.cpp) adds its functions to
// fuseops._C without an edit anywhere else:
//
//   FUSEOPS_PYTHON_BINDINGS(relu) {
//     m.def("relu", &fuseops::relu, py::arg("input"));
//   }
//
// registers the block while the module is loaded (static initialisation, at
// dlopen) and module.cpp runs every registered block when Python imports it.

#include <torch/csrc/utils/pybind.h>

namespace fuseops::python {

namespace py = pybind11;

using Bindings = void (*)(py::module_& m);

// Returns true, so that a namespace-scope initialiser can call it.
bool add_bindings(Bindings bindings);

void bind_all(py::module_& m);

}  // namespace fuseops::python

#define FUSEOPS_PYTHON_BINDINGS(name)                                  \
  static void fuseops_bind_##name(::fuseops::python::py::module_& m);  \
  [[maybe_unused]] static const bool fuseops_bindings_##name##_added = \
      ::fuseops::python::add_bindings(&fuseops_bind_##name);           \
  static void fuseops_bind_##name(::fuseops::python::py::module_& m)
