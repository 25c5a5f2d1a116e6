// The int8 quantization ops are inference ops without a derivative
// (rounding has none worth propagating). Their Autograd kernels refuse a
// call that would record a gradient, under the project's one policy
// (cpp/ops/autograd/no_derivative.h), instead of returning results whose
// gradient would silently be None; otherwise they run the device kernel.

#include <torch/library.h>

#include <fuseops/quantize.h>

#include "ops/autograd/no_derivative.h"

namespace fuseops {

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  autograd_detail::register_inference<"fuseops::quantize_per_channel_int8",
                                      &fuseops::quantize_per_channel_int8>(m);
  autograd_detail::register_inference<"fuseops::quantize_per_token_int8",
                                      &fuseops::quantize_per_token_int8>(m);
  autograd_detail::register_inference<"fuseops::dequantize_int8", &fuseops::dequantize_int8>(m);
}

}  // namespace fuseops
