"""The test and bench cases of :mod:`fuseops.ops.moe_experts` (see
:mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

import torch

from .. import moe_experts as family
from ._sample import DTYPES, Sample, tensor

#: The bench's experts: 8, each token to 2 of them (Mixtral's routing),
#: intermediate size 2.75 x hidden rounded to 64.
_EXPERTS, _TOP_K = 8, 2


class _MoeShapes:
    """Least traffic of a case of ``(tokens, hidden)`` with the bench's
    experts (:func:`_routed_experts`): the experts' weights read once, the
    activations written and read once."""

    def __init__(self, backward: bool = False):
        self.backward = backward

    def bytes(self, rows: int, hidden: int, element_size: int) -> int:
        weights = _EXPERTS * 3 * _intermediate(hidden) * hidden
        activations = 2 * rows * hidden
        return element_size * (weights + activations) * (3 if self.backward else 1)


def _intermediate(hidden: int) -> int:
    return max(64, (hidden * 11 // 4) // 64 * 64)


def _routed_experts(rows, hidden, dtype, device, gen):
    """A layer's routed experts on ``rows`` tokens: top-2 of 8 by a random
    router's softmax (renormalised, as Mixtral's), weights of std 0.02."""
    inter = _intermediate(hidden)
    x = torch.randn(rows, hidden, dtype=dtype, device=device, generator=gen)
    logits = torch.randn(rows, _EXPERTS, device=device, generator=gen)
    weights, index = logits.softmax(-1).topk(_TOP_K, dim=-1)
    weights = (weights / weights.sum(-1, keepdim=True)).to(dtype)

    def param(*shape):
        return (torch.randn(shape, device=device, generator=gen) * 0.02).to(dtype)

    return x, index, weights, param(_EXPERTS, 2 * inter, hidden), param(_EXPERTS, hidden, inter)


def bench_cases():
    from ._bench_case import Case

    return [
        Case(
            "moe_experts",
            "moe_experts",
            "moe_experts",
            _routed_experts,
            forward_traffic=_MoeShapes(),
            backward_traffic=_MoeShapes(backward=True),
            native=family.moe_experts_grouped_mm,
            native_label="torch._grouped_mm",
            has_out=False,
            differentiable=(0, 2, 3, 4),
            shapes={
                "quick": [(256, 1024)],
                "standard": [(512, 1024), (2048, 1024)],
                "full": [(2048, 2048), (8192, 2048)],
            },
            description="routed experts of a MoE layer, top-2 of 8 gated MLPs (intermediate "
            "2.75 x hidden); reference: transformers' eager experts loop",
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops

    def call(
        tokens=7,
        hidden=6,
        inter=5,
        experts=4,
        top_k=2,
        dtype=torch.float32,
        activation="silu",
        grad=False,
        transposed=False,
        index_dtype=torch.int64,
        weights_dtype=None,
        large=False,
        backward=None,
    ):
        index = torch.randint(0, experts, (tokens, top_k), device=device, dtype=index_dtype)
        weights = torch.rand(tokens, top_k, device=device).to(weights_dtype or dtype)
        gate_up_shape = (experts, 2 * inter, hidden)
        # transformers' transposed layout ([E, H, 2I] stored) read in place.
        layout = "transposed" if transposed else "contiguous"
        gate_up = tensor(gate_up_shape, dtype, device, layout, grad, scale=0.3)
        down = tensor((experts, hidden, inter), dtype, device, layout, grad, scale=0.3)
        x = tensor((tokens, hidden), dtype, device, grad=grad)
        args = (x, index, weights.requires_grad_(grad), gate_up, down, activation)
        if backward is None:
            return Sample(ops.moe_experts.default, args, family.moe_experts, large=large)
        if backward == "forward":
            return Sample(ops.moe_experts_forward.default, args, family.moe_experts_forward)
        grad_out = tensor((tokens, hidden), dtype, device)
        kept = None
        if backward == "kept":
            with torch.no_grad():
                kept = family.moe_experts_forward(*args)[1]
        return Sample(
            ops.moe_experts_backward.default,
            (grad_out, *args, backward != "frozen", kept),
            family.moe_experts_backward,
        )

    result = [
        call(),
        call(grad=True),
        call(dtype=torch.bfloat16, grad=True, transposed=True),
        call(dtype=torch.float64, activation="gelu", grad=True, index_dtype=torch.int32),
        call(dtype=torch.float16, activation="gelu_tanh", weights_dtype=torch.float32, grad=True),
        call(tokens=0, grad=True),
        call(top_k=0),
        call(experts=1, top_k=3, grad=True),
        call(backward="forward"),
        call(dtype=torch.bfloat16, backward="forward", transposed=True),
        call(backward="recompute"),
        call(dtype=torch.bfloat16, backward="kept"),
        call(dtype=torch.float64, backward="frozen", activation="gelu"),
    ]
    # Every CPU build against the float64 reference: several experts'
    # products and several tasks per thread in the per-token sum, a vector
    # tail in every row.
    result += [
        call(301, 67, 40, 6, 2, dtype, activation, grad=True, large=True)
        for dtype, activation in zip(DTYPES, ("silu", "gelu", "gelu_tanh", "silu"))
    ]
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    tokens, hidden, inter, top_k = d.size(), d.size(), d.size(), d.size(4)
    experts = d.int(1, 5)
    x = d.tensor((tokens, hidden), grad=True)
    index = d.integers((tokens, top_k), 0, experts, d.choice((torch.int64, torch.int32)))
    weights = d.tensor((tokens, top_k), d.choice((x.dtype, torch.float32)), grad=True)
    gate_up = d.tensor((experts, 2 * inter, hidden), x.dtype, 0.5, grad=True)
    down = d.tensor((experts, hidden, inter), x.dtype, 0.5, grad=True)
    activation = d.choice(tuple(family.ACTIVATIONS))
    return Sample(
        torch.ops.fuseops.moe_experts.default,
        (x, index, weights, gate_up, down, activation),
        family.moe_experts,
    )


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py): each
    activation, int64 and int32 indices, a token routed to one expert twice
    and an expert no token is routed to. float32 and float64 within 1e-5
    (the products' sums run in another order); bfloat16 and float16 within
    2e-2 of the largest result: the op rounds each product to the dtype when
    an expert has fewer than 32 rows (transformers' loop does too), the dense
    form keeps them in float32."""
    import itertools

    from .._export import EXPORT_DTYPES, ExportCase, gelu_limits
    from .._export import randn as t

    ops = torch.ops.fuseops
    cases = []
    for dtype, activation in itertools.product(EXPORT_DTYPES, family.ACTIVATIONS):
        tokens, hidden, inter, experts = 5, 16, 8, 4
        index = torch.tensor([[0, 2], [1, 1], [2, 0], [0, 1], [2, 1]])
        if activation == "gelu":
            index = index.to(torch.int32)
        weights = t(tokens, 2, dtype=dtype).softmax(-1)
        args = (
            t(tokens, hidden, dtype=dtype),
            index,
            weights,
            t(experts, 2 * inter, hidden, dtype=dtype, scale=hidden**-0.5),
            t(experts, hidden, inter, dtype=dtype, scale=inter**-0.5),
        )
        tolerance = 1e-5 if dtype in (torch.float32, torch.float64) else 2e-2
        cases.append(
            ExportCase(
                ops.moe_experts.default,
                f"{dtype} {activation} {tokens} tokens top-2 of {experts}",
                args,
                call=lambda *a, act=activation: ops.moe_experts(*a, act),
                rtol=tolerance,
                atol=tolerance,
                not_run_by=gelu_limits(dtype, "none" if activation == "gelu" else None),
            )
        )
    return cases


def autocast_cases() -> list:
    """moe_experts under CPU autocast against transformers' loop, whose
    products autocast runs in bfloat16 and whose result is in hidden's dtype
    (tests_py/test_autocast.py). The op has no autocast kernel: it computes
    in its inputs' dtypes and returns hidden's dtype too. So the case is a
    bfloat16 model's: with float32 inputs the loop's bfloat16 products and
    the op's float32 ones agree only to bfloat16 rounding, where the test
    holds float32 results to float32's."""
    from ._autocast import LOW, AutocastCase, D, rand

    def routed(dtype=torch.float32):
        # Matrices of std 1/sqrt(D): results of order 1, where 3e-2 is a
        # few bfloat16 units of the loop's rounded sums.
        return (
            rand(4, D, dtype=dtype),
            torch.randint(0, 3, (4, 2)),
            torch.rand(4, 2),
            (rand(3, 2 * D, D) / D**0.5).to(dtype),
            (rand(3, D, D) / D**0.5).to(dtype),
        )

    return [
        AutocastCase("moe_experts", family.moe_experts, family.moe_experts_reference, [routed(LOW)])
    ]
