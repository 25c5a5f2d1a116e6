// decode_attention is an inference op without a derivative. Its Autograd
// kernel refuses a call that would record a gradient, under the project's
// one policy (cpp/ops/autograd/no_derivative.h); otherwise it runs the
// device kernel. Training keeps torch's scaled_dot_product_attention
// (fuseops.transformers routes there when a gradient is recorded).

#include <ATen/core/Tensor.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <fuseops/decode_attention.h>

#include "ops/autograd/no_derivative.h"

namespace fuseops {
namespace {

at::Tensor decode_attention_autograd(const at::Tensor& query, const at::Tensor& key,
                                     const at::Tensor& value,
                                     const std::optional<at::Tensor>& attn_mask, bool is_causal,
                                     std::optional<double> scale, double softcap) {
  autograd_detail::check_inference("fuseops::decode_attention", {query, key, value, attn_mask});
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fuseops::decode_attention(query, key, value, attn_mask, is_causal, scale, softcap);
}

}  // namespace

TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {
  m.impl("decode_attention", TORCH_FN(decode_attention_autograd));
}

}  // namespace fuseops
