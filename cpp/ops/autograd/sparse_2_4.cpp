// The 2:4 sparse ops are inference ops without a derivative, under the int8
// ops' policy: their Autograd kernels refuse a call that would record a
// gradient (cpp/ops/autograd/no_derivative.h), instead of returning results
// whose gradient would silently be None; otherwise they run the device
// kernel.

#include <torch/library.h>

#include <fuseops/sparse_2_4.h>

#include "ops/autograd/no_derivative.h"

namespace fuseops {

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  autograd_detail::register_inference<"fuseops::prune_2_4", &fuseops::prune_2_4>(m);
  autograd_detail::register_inference<"fuseops::pack_2_4", &fuseops::pack_2_4>(m);
  autograd_detail::register_inference<"fuseops::sparse_2_4_linear", &fuseops::sparse_2_4_linear>(m);
  autograd_detail::register_inference<"fuseops::sparse_2_4_dynamic_linear",
                                      &fuseops::sparse_2_4_dynamic_linear>(m);
}

}  // namespace fuseops
