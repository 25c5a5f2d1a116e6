// The int4 linear ops are inference ops without a derivative. Their
// Autograd kernels refuse a call that would record a gradient, under the
// project's one policy (cpp/ops/autograd/no_derivative.h), instead of
// returning results whose gradient would silently be None; otherwise they
// run the device kernel.

#include <torch/library.h>

#include <fuseops/int4_linear.h>

#include "ops/autograd/no_derivative.h"

namespace fuseops {

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  autograd_detail::register_inference<"fuseops::quantize_per_group_int4",
                                      &fuseops::quantize_per_group_int4>(m);
  autograd_detail::register_inference<"fuseops::pack_int4_weight", &fuseops::pack_int4_weight>(m);
  autograd_detail::register_inference<"fuseops::int4_weight_only_linear",
                                      &fuseops::int4_weight_only_linear>(m);
  autograd_detail::register_inference<"fuseops::int4_dynamic_linear",
                                      &fuseops::int4_dynamic_linear>(m);
}

}  // namespace fuseops
