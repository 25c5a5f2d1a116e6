// The int8 linear ops are inference ops without a derivative. Their
// Autograd kernels refuse a call that would record a gradient, under the
// project's one policy (cpp/ops/autograd/no_derivative.h), instead of
// returning results whose gradient would silently be None; otherwise they
// run the device kernel.

#include <torch/library.h>

#include <fuseops/int8_linear.h>

#include "ops/autograd/no_derivative.h"

namespace fuseops {

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  autograd_detail::register_inference<"fuseops::pack_int8_weight", &fuseops::pack_int8_weight>(m);
  autograd_detail::register_inference<"fuseops::int8_weight_only_linear",
                                      &fuseops::int8_weight_only_linear>(m);
  autograd_detail::register_inference<"fuseops::int8_dynamic_linear",
                                      &fuseops::int8_dynamic_linear>(m);
}

}  // namespace fuseops
