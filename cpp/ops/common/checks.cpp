#include "ops/common/checks.h"

#include <c10/util/Exception.h>

namespace fuseops {

void check_floating_input(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": argument '", arg,
              "' must be a defined tensor, got an undefined tensor");
  const auto dtype = t.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble ||
                  dtype == at::kBFloat16 || dtype == at::kHalf,
              op, ": argument '", arg,
              "' must have dtype float32, float64, bfloat16 or float16, got ",
              dtype);
}

void check_same_dtype(const char* op, const char* arg, const at::Tensor& t,
                      const char* ref_arg, const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": argument '", arg,
              "' must have the same dtype as '", ref_arg, "' (",
              ref.scalar_type(), "), got ", t.scalar_type());
}

void check_same_device(const char* op, const char* arg, const at::Tensor& t,
                       const char* ref_arg, const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), op, ": argument '", arg,
              "' must be on the same device as '", ref_arg, "' (",
              ref.device(), "), got ", t.device());
}

void check_same_shape(const char* op, const char* arg, const at::Tensor& t,
                      const char* ref_arg, const at::Tensor& ref) {
  TORCH_CHECK(t.sizes() == ref.sizes(), op, ": argument '", arg,
              "' must have the same shape as '", ref_arg, "' ", ref.sizes(),
              ", got ", t.sizes());
}

void check_out(const char* op, const at::Tensor& out, const char* ref_arg,
               const at::Tensor& ref) {
  TORCH_CHECK(out.defined(), op, ": argument 'out' must be a defined tensor");
  check_same_dtype(op, "out", out, ref_arg, ref);
  check_same_device(op, "out", out, ref_arg, ref);
}

void resize_out(at::Tensor& out, at::IntArrayRef sizes) {
  if (out.sizes() != sizes) {
    out.resize_(sizes);
  }
}

}  // namespace fuseops
