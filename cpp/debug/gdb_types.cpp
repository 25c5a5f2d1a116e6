// Full debug descriptions of the torch classes that gdb's printers read.
//
// The pip torch libraries carry no DWARF, and GCC emits only a declaration
// for a polymorphic class in translation units that do not define its key
// function (its first non-inline virtual function) -- for c10::TensorImpl,
// c10::StorageImpl and torch::autograd::AutogradMeta that function lives in
// the torch libraries. This file is compiled with -femit-class-debug-always,
// so the types it mentions get their complete layout here, once, and gdb
// uses it for the whole program (tools/gdb/README.md).
//
// The file holds no code the library calls. Built into libfuseops in builds
// with debug information, and on its own as the installed types object that
// other programs can load into gdb.

#include <c10/core/StorageImpl.h>
#include <c10/core/SymIntArrayRef.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/UndefinedTensorImpl.h>
#include <torch/csrc/autograd/variable.h>

namespace fuseops::gdb_types {

// One parameter per class whose layout the printers need. The function is
// exported, so neither the compiler nor the linker drops it, and with it the
// type descriptions stay.
__attribute__((visibility("default"), used, noinline)) void describe_types_for_gdb(
    c10::TensorImpl* tensor_impl, c10::UndefinedTensorImpl* undefined_tensor_impl,
    c10::StorageImpl* storage_impl, c10::ExtraMeta* extra_meta,
    c10::SymbolicShapeMeta* symbolic_shape_meta, c10::SymNodeImpl* sym_node_impl,
    c10::AutogradMetaInterface* autograd_meta_interface,
    torch::autograd::AutogradMeta* autograd_meta, c10::VariableVersion* variable_version,
    c10::impl::PyObjectSlot* pyobject_slot) {}

}  // namespace fuseops::gdb_types
