// decode_attention is an inference op without a derivative. Its Autograd
// kernel refuses a call that would record a gradient, under the project's
// one policy (cpp/ops/autograd/no_derivative.h); otherwise it runs the
// device kernel. Training keeps torch's scaled_dot_product_attention
// (fuseops.transformers routes there when a gradient is recorded).

#include <torch/library.h>

#include <fuseops/decode_attention.h>

#include "ops/autograd/no_derivative.h"

namespace fuseops {

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  autograd_detail::register_inference<"fuseops::decode_attention", &fuseops::decode_attention>(m);
}

}  // namespace fuseops
