#pragma once
// Input checks shared by every op and every backend (CPU, CUDA, Meta), so the
// same bad input gets the same message everywhere. Messages name the op, the
// argument, what was expected and what was given.

#include <functional>
#include <initializer_list>

#include <ATen/core/Tensor.h>

namespace fuseops {

// `arg` is a defined tensor.
void check_defined(const char* op, const char* arg, const at::Tensor& t);

// `arg` is defined and has a floating dtype fuseops computes in
// (float32, float64, bfloat16, float16).
void check_floating_input(const char* op, const char* arg, const at::Tensor& t);

// `arg` matches `ref_arg` in dtype, device and shape.
void check_same_dtype(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                      const at::Tensor& ref);
void check_same_device(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                       const at::Tensor& ref);
void check_same_shape(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                      const at::Tensor& ref);

// `out` of an `.out` overload (argument `out_arg`): defined, same dtype and
// device as `ref`.
// Its shape is fixed by prepare_outputs().
void check_out(const char* op, const at::Tensor& out, const char* ref_arg, const at::Tensor& ref,
               const char* out_arg = "out");

// A tensor argument and its name in the op's schema, for error messages.
struct NamedTensor {
  const char* name;
  const at::Tensor& tensor;  // may be undefined (an absent optional)
};

// The one rule for out= tensors of every op (CPU, CUDA and Meta alike):
//  - an out= tensor whose elements overlap each other (an expanded tensor, or
//    strides that cannot be proven disjoint) is refused: which write wins
//    would be unspecified;
//  - two out= tensors of one call that share memory are refused: one result
//    would silently overwrite the other;
//  - an out= tensor that must be resized is refused when it shares memory
//    with an input: the resize would change that input (its shape, when it
//    is the same tensor) before the kernel reads it;
//  - otherwise each out= tensor is resized to `sizes` (as ATen's out= ops
//    do). Overlap between an out= tensor and an input is then allowed and
//    computed correctly: see writes_directly().
// Errors name `op` and the arguments involved.
void prepare_outputs(const char* op, std::initializer_list<NamedTensor> outputs,
                     at::IntArrayRef sizes, std::initializer_list<NamedTensor> inputs);

// Conservative: true unless the two tensors provably touch disjoint bytes
// (different storages, or address ranges that do not intersect; fake tensors
// with symbolic shapes never share). Unlike at::get_overlap_status it never
// answers "too hard".
bool share_memory(const at::Tensor& a, const at::Tensor& b);

// Whether a kernel may write straight into `out`: `out` is contiguous and
// shares no memory with any of `inputs` except that an input in `same_index`
// may be exactly `out` (same first element, both contiguous, same size),
// which is safe for kernels that read element i (or the whole row holding
// it) before writing element i. Any other overlap -- partial, or one ATen
// can only call too hard to decide -- needs a temporary that is copied into
// `out` once the kernel has read every input. The tensors are those the
// kernel reads (after any contiguous() copy).
bool writes_directly(const at::Tensor& out, std::initializer_list<at::Tensor> same_index,
                     std::initializer_list<at::Tensor> inputs);

// Fills a caller's `out` with `fill(target)`: straight into `out` when
// writes_directly(out, same_index, inputs) allows it, else into a temporary
// copied over afterwards.
void fill_out(const at::Tensor& out, std::initializer_list<at::Tensor> same_index,
              std::initializer_list<at::Tensor> inputs,
              const std::function<void(const at::Tensor&)>& fill);

}  // namespace fuseops
