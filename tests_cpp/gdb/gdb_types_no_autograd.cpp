// The layouts of c10's tensor classes without autograd's: the debug
// information of a program that describes c10::TensorImpl and
// c10::StorageImpl but not torch::autograd::AutogradMeta. The printers must
// still show dtype, shape, strides and values (tests_py/test_gdb.py).
// Compiled with -femit-class-debug-always, like cpp/debug/gdb_types.cpp.

#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/UndefinedTensorImpl.h>

__attribute__((visibility("default"), used, noinline)) void describe_c10_types_for_gdb(
    c10::TensorImpl* tensor_impl, c10::UndefinedTensorImpl* undefined_tensor_impl,
    c10::StorageImpl* storage_impl) {}
