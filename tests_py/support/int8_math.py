"""The float64 reference of the W8A8 (dynamic) linear ops' math and its
tolerance, shared by the dense (test_int8_linear.py) and 2:4
(test_sparse_2_4.py) tests. Why the tolerance holds is in those files'
docstrings: the int8 products are summed exactly, only the float32 epilogue
rounds (float(acc), two products, the bias add: 4 roundings, 2.4e-7 of
max|y|), plus one unit in the last place of bfloat16/float16 results."""

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
