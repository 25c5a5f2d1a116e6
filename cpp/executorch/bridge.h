#pragma once
// The boundary between fuseops' ExecuTorch kernel library's two halves:
// kernels.cpp sees only ExecuTorch's headers (its tensors and its vendored
// copy of c10), bridge.cpp only PyTorch's. Neither can include the other's
// headers (the two c10s collide), so what crosses is plain data: an
// ExecuTorch value's kind and contents, a tensor as its data pointer, dtype
// (ExecuTorch's and c10's ScalarType numbers agree), sizes and strides.

#include <cstddef>
#include <cstdint>

namespace fuseops::executorch_bridge {

// The kinds of argument fuseops' inference ops take.
enum class ValueKind : int32_t { None, Tensor, Int, Double, Bool, String };

// More dimensions than this are refused (no fuseops op takes that many).
inline constexpr int kMaxDims = 8;

struct TensorView {
  void* data = nullptr;
  int32_t dtype = 0;
  int32_t dim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
};

struct Value {
  ValueKind kind = ValueKind::None;
  TensorView tensor;
  int64_t integer = 0;
  double real = 0.0;
  bool boolean = false;
  const char* text = nullptr;  // String, not null-terminated
  size_t length = 0;           // String
};

// Adds the fuseops op `op` (its overload `overload`, "" for the default) to
// the ops `call` runs and returns its slot; -1 with `error` written when the
// op does not exist or returns anything but tensors.
int add_op(const char* op, const char* overload, char* error, size_t error_size);

// How many values of an out variant's stack `call` reads for the op in
// `slot`: its arguments and outputs (0 for a slot without an op).
size_t values_read(int slot);

// Runs the op in `slot` on an ExecuTorch out variant's stack: the op's
// arguments, then one preallocated output tensor per result (then the
// results again, which alias the outputs and are not read). Returns false
// with `error` written when the op fails or `count` is too small.
bool call(int slot, const Value* values, size_t count, char* error, size_t error_size);

}  // namespace fuseops::executorch_bridge
