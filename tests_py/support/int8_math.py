"""The float64 references of the W8A8 (dynamic) linear ops' math and their
tolerances: per row (the 2:4 op, test_sparse_2_4.py, and the activations of
the older dense op) and per activation block of 32 (int8_dynamic_linear,
test_int8_linear.py). Why the tolerances hold is in those files'
docstrings: the int8 products are summed exactly, only the float32 epilogue
rounds (per row: float(acc), two products, the bias add: 4 roundings,
2.4e-7 of max|y|; per block, one fused multiply-add per block besides),
plus one unit in the last place of bfloat16/float16 results."""

from __future__ import annotations

import torch

#: One unit in the last place of the result's dtype, relative.
ROUNDING = {torch.float32: 0.0, torch.float64: 0.0, torch.bfloat16: 2**-8, torch.float16: 2**-11}

#: Of max|y|: the epilogue's float32 roundings, with margin.
DYNAMIC_TOLERANCE = 1e-6


def dynamic_reference(x, wq, scale, bias=None):
    # Written out independently of fuseops.reference: quantize_per_token_int8's
    # float32 math, then exact float64 products and sums.
    xf = x.float()
    # Through float64 so that the division is correctly rounded on CUDA too
    # (ATen divides by a Python scalar there as a product with its reciprocal).
    xs = (xf.abs().amax(-1, keepdim=True).double() / 127).float()
    xs = torch.where(xs == 0, torch.ones_like(xs), xs)
    xq = torch.round(xf / xs).clamp(-127, 127)
    y = (xq.double() @ wq.double().T) * xs.double() * scale.double()
    return y if bias is None else y + bias.double()


def assert_dynamic_matches(y, want):
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(
        y.double(),
        want,
        rtol=ROUNDING[y.dtype],
        atol=(DYNAMIC_TOLERANCE + ROUNDING[y.dtype]) * scale,
    )


#: K values per activation scale of int8_dynamic_linear.
ACTIVATION_BLOCK = 32


def block_dynamic_reference(x, wq, scale, bias=None):
    """int8_dynamic_linear's math in float64, written out independently of
    fuseops.reference: each block of 32 of a row (zeros past K) quantized as
    dynamic_reference quantizes a row, exact products and sums per block,
    each block's sum times its scale, summed over the blocks."""
    k = x.shape[-1]
    blocks = -(-k // ACTIVATION_BLOCK)
    pad = blocks * ACTIVATION_BLOCK - k
    xf = torch.nn.functional.pad(x.float(), (0, pad)).reshape(*x.shape[:-1], blocks, -1)
    xs = (xf.abs().amax(-1, keepdim=True).double() / 127).float()
    xs = torch.where(xs == 0, torch.ones_like(xs), xs)
    xq = torch.round(xf / xs).clamp(-127, 127)
    w = torch.nn.functional.pad(wq.double(), (0, pad)).reshape(wq.shape[0], blocks, -1)
    per_block = torch.einsum("...bk,nbk->...bn", xq.double(), w) * xs.double()
    y = per_block.sum(-2) * scale.double()
    return y if bias is None else y + bias.double()


def assert_block_dynamic_matches(y, want, k):
    """The per-block epilogue sums ceil(K/32) float32 terms in order: within
    2e-6 * sqrt(K) of max|y| (as the float32-summing linears' tests)."""
    tolerance = 2e-6 * max(1.0, k) ** 0.5 + ROUNDING[y.dtype]
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(y.double(), want, rtol=ROUNDING[y.dtype], atol=tolerance * scale)
