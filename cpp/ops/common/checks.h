#pragma once
// Input checks shared by every op and every backend (CPU, CUDA, Meta), so the
// same bad input gets the same message everywhere. Messages name the op, the
// argument, what was expected and what was given.

#include <ATen/core/Tensor.h>

namespace fuseops {

// `arg` is defined and has a floating dtype fuseops computes in
// (float32, float64, bfloat16, float16).
void check_floating_input(const char* op, const char* arg, const at::Tensor& t);

// `arg` matches `ref_arg` in dtype, device and shape.
void check_same_dtype(const char* op, const char* arg, const at::Tensor& t,
                      const char* ref_arg, const at::Tensor& ref);
void check_same_device(const char* op, const char* arg, const at::Tensor& t,
                       const char* ref_arg, const at::Tensor& ref);
void check_same_shape(const char* op, const char* arg, const at::Tensor& t,
                      const char* ref_arg, const at::Tensor& ref);

// `out` of an `.out` overload: defined, same dtype and device as `ref`.
// Its shape is fixed by resize_out().
void check_out(const char* op, const at::Tensor& out, const char* ref_arg,
               const at::Tensor& ref);

// Resizes `out` to `sizes` (as ATen's out= ops do) when it differs.
void resize_out(at::Tensor& out, at::IntArrayRef sizes);

}  // namespace fuseops
