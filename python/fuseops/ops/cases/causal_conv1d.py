"""The test and bench cases of :mod:`fuseops.ops.causal_conv1d` (see
:mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ._sample import DTYPES, Sample, tensor

if TYPE_CHECKING:
    from typing import Callable, Sequence, TypedDict

    from ._bench_case import Traffic

    class _CaseFields(TypedDict):
        """The keyword arguments of ``Case`` that the two layouts' cases share."""

        options: dict
        forward_traffic: Traffic
        backward_traffic: Traffic
        call_out: Callable
        differentiable: Sequence[int]


from .. import causal_conv1d as family


def _batch_seqlen(rows: int) -> tuple[int, int]:
    # The bench's ROWSxHIDDEN is (batch * seqlen) x dim, batch 4 where it
    # divides: --shapes 16384x2048 is Mamba's batch 4, seqlen 4096, dim 2048.
    batch = 4 if rows % 4 == 0 else 1
    return batch, rows // batch


def _bench_inputs(channel_last: bool):
    def make(rows, hidden, dtype, device, gen):
        from ._bench_case import vector

        batch, seqlen = _batch_seqlen(rows)
        shape = (batch, seqlen, hidden) if channel_last else (batch, hidden, seqlen)
        x = torch.randn(shape, dtype=dtype, device=device, generator=gen)
        if channel_last:
            x = x.transpose(1, 2)
        weight = (
            0.5 * torch.randn(hidden, 4, dtype=torch.float32, device=device, generator=gen)
        ).to(dtype)
        return x, weight, vector(hidden, dtype, device, gen, offset=0.0)

    return make


def bench_cases():
    from ._bench_case import Case, Traffic

    common: _CaseFields = dict(
        options={"activation": "silu"},
        forward_traffic=Traffic(rows=2, vectors=5),  # x in, out out; weight (4 per channel), bias
        backward_traffic=Traffic(rows=3, vectors=10),  # dy, x in; dx out; weight, bias in and out
        call_out=lambda fn, args, options, outs: fn(*args, **options, out=outs[0]),
        differentiable=(0, 1, 2),
    )
    return [
        Case(
            "causal_conv1d",
            "causal_conv1d",
            "causal_conv1d",
            _bench_inputs(False),
            description="Mamba's depthwise causal conv1d, width 4, bias, SiLU; x (batch 4, dim, "
            "seqlen) contiguous",
            **common,
        ),
        Case(
            "causal_conv1d_channel_last",
            "causal_conv1d",
            "causal_conv1d",
            _bench_inputs(True),
            description="causal_conv1d with x channel-last (a transposed (batch, seqlen, dim))",
            **common,
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops

    def t(shape, dtype=torch.float32, layout="contiguous", grad=False):
        return tensor(shape, dtype, device, layout, grad)

    def channel_last(batch, dim, seqlen, dtype=torch.float32, grad=False):
        return t((batch, seqlen, dim), dtype).transpose(1, 2).detach().requires_grad_(grad)

    def conv(x, w, b=None, init=None, activation=None, **kwargs):
        return Sample(
            ops.causal_conv1d.default,
            (x, w, b, init, activation),
            family.causal_conv1d,
            wrapper_args=(x, w, b, init, False, activation),
            **kwargs,
        )

    def forward(x, w, b=None, init=None, activation=None):
        return Sample(
            ops.causal_conv1d_forward.default,
            (x, w, b, init, activation),
            family.causal_conv1d,
            wrapper_args=(x, w, b, init, True, activation),
        )

    x, w, b = t((2, 6, 9)), t((6, 4)), t((6,))
    init = t((2, 6, 3))
    steady = t((2, 6))
    steady_state = steady[..., None].repeat(1, 1, 4)
    result = [
        conv(x, w, b, None, "silu"),
        conv(x, t((6, 2)), None, t((2, 6, 1)), None),
        conv(channel_last(2, 8, 5), t((8, 3)), t((8,)), t((2, 8, 2)), "silu"),
        conv(
            t((2, 6, 9), grad=True),
            t((6, 4), grad=True),
            t((6,), grad=True),
            t((2, 6, 3), grad=True),
            "silu",
        ),
        conv(channel_last(2, 8, 11, grad=True), t((8, 4), grad=True), None, None, "silu"),
        conv(
            t((3, 5, 7), torch.bfloat16, "sliced", True),
            t((5, 3), grad=True),
            t((5,), grad=True),
            None,
            "silu",
        ),
        conv(
            t((2, 4, 2), torch.float16),
            t((4, 4), torch.float16),
            None,
            t((2, 4, 3), torch.float16),
            None,
        ),
        conv(
            t((2, 4, 6), torch.float64, "expanded", True),
            t((4, 3), torch.float64, "sliced", True),
            None,
            None,
            None,
        ),
        conv(t((0, 4, 6), grad=True), t((4, 4), grad=True), t((4,), grad=True), None, "silu"),
        Sample(
            ops.causal_conv1d.out,
            (x, w, b, init, "silu"),
            family.causal_conv1d,
            {"out": torch.empty(2, 6, 9, device=device)},
            wrapper_args=(x, w, b, init, False, "silu"),
        ),
        forward(x, w, b, init, "silu"),
        forward(
            t((2, 6, 2), grad=True), t((6, 4), grad=True), None, t((2, 6, 3), grad=True), "silu"
        ),
        forward(
            channel_last(2, 8, 11, torch.bfloat16, True),
            t((8, 4), torch.bfloat16, grad=True),
            None,
            None,
            None,
        ),
        Sample(
            ops.causal_conv1d_backward.default,
            (t((2, 6, 9)), x, w, b, init, t((2, 6, 3)), "silu"),
            family.causal_conv1d_backward,
        ),
        Sample(
            ops.causal_conv1d_backward.default,
            (t((2, 6, 9)), x, w, None, None, None, None),
            family.causal_conv1d_backward,
        ),
        # First: a state that each call leaves as it was (x repeats the
        # state's constant rows), as the compiler tests call the op twice on
        # one conv_state and compare the results.
        Sample(
            ops.causal_conv1d_update.default,
            (steady, steady_state, w, b, "silu"),
            family.causal_conv1d_update,
        ),
        Sample(
            ops.causal_conv1d_update.default,
            (t((2, 6)), t((2, 6, 3)), w, b, "silu"),
            family.causal_conv1d_update,
        ),
        Sample(
            ops.causal_conv1d_update.default,
            (t((2, 6, 3)), t((2, 6, 5)), w, None, None),
            family.causal_conv1d_update,
        ),
        Sample(
            ops.causal_conv1d_update.default,
            (
                t((2, 8), torch.bfloat16),
                t((2, 9, 8), torch.bfloat16).transpose(1, 2)[:, :, :3],
                t((8, 4), torch.bfloat16),
                None,
                "silu",
            ),
            family.causal_conv1d_update,
        ),
    ]
    for dtype in DTYPES:
        for batch, dim, seqlen in [(2, 37, 1000), (2, 4100, 140)]:
            result.append(
                conv(
                    t((batch, dim, seqlen), dtype, grad=True),
                    t((dim, 4), dtype, grad=True),
                    t((dim,), dtype, grad=True),
                    t((batch, dim, 3), dtype, grad=True),
                    "silu",
                    large=True,
                )
            )
            result.append(
                conv(
                    channel_last(batch, dim, seqlen, dtype, True),
                    t((dim, 3), dtype, grad=True),
                    t((dim,), dtype, grad=True),
                    None,
                    "silu",
                    large=True,
                )
            )
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    # dim and seqlen >= 1: the reference's F.conv1d takes no zero groups
    # and no input shorter than the kernel.
    ops, activation = torch.ops.fuseops, d.choice((None, "silu", "swish"))
    batch, dim, width = d.size(4), d.int(1, 9), d.int(2, 4)
    x = d.tensor((batch, dim, d.int(1, 9)), grad=True)
    param = d.choice(
        (x.dtype, torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype)
    )
    w, b = (
        d.tensor((dim, width), param, 0.5, grad=True),
        d.maybe(lambda: d.tensor((dim,), param, grad=True)),
    )
    if d.flag():
        state = d.tensor((batch, dim, width - 1 + d.int(0, 2)), x.dtype, writable=True)
        step = d.tensor((batch, dim) + ((d.int(1, 3),) if d.flag() else ()), x.dtype)
        w, b = w.detach(), b if b is None else b.detach()  # an inference step
        return Sample(
            ops.causal_conv1d_update.default,
            (step, state, w, b, activation),
            family.causal_conv1d_update,
        )
    init = d.maybe(lambda: d.tensor((batch, dim, width - 1), x.dtype, grad=True))
    if d.flag():
        return Sample(
            ops.causal_conv1d_forward.default,
            (x, w, b, init, activation),
            family.causal_conv1d_forward,
        )
    return Sample(ops.causal_conv1d.default, (x, w, b, init, activation), family.causal_conv1d)


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py)."""
    from .._export import EXPORT_DTYPES, ExportCase
    from .._export import randn as t

    op = torch.ops.fuseops.causal_conv1d.default
    cases = []
    for dtype in EXPORT_DTYPES:
        # Parameters in x's dtype, or float32 for bfloat16/float16 x.
        param = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
        cases += [
            ExportCase(
                op,
                f"{dtype} width 4, bias, silu",
                (t(2, 6, 9, dtype=dtype), t(6, 4, dtype=param, scale=0.5), t(6, dtype=param)),
                lambda x, w, b: torch.ops.fuseops.causal_conv1d(x, w, b, None, "silu"),
            ),
            ExportCase(
                op,
                f"{dtype} width 3, initial states, no bias",
                (t(1, 5, 7, dtype=dtype), t(5, 3, dtype=param, scale=0.5), t(1, 5, 2, dtype=dtype)),
                lambda x, w, s: torch.ops.fuseops.causal_conv1d(x, w, None, s, None),
            ),
            # Shorter than the kernel: every output reads the initial states.
            ExportCase(
                op,
                f"{dtype} width 4, 2 steps, initial states, bias, swish",
                (
                    t(3, 4, 2, dtype=dtype),
                    t(4, 4, dtype=param, scale=0.5),
                    t(4, dtype=param),
                    t(3, 4, 3, dtype=dtype),
                ),
                lambda x, w, b, s: torch.ops.fuseops.causal_conv1d(x, w, b, s, "swish"),
            ),
        ]
    return cases


def autocast_cases() -> list:
    """causal_conv1d under CPU autocast against torch's depthwise conv1d (tests_py/test_autocast.py)."""

    from ._autocast import LOW, AutocastCase, D, rand

    def causal_conv1d_torch(x, w, b):
        out = F.conv1d(x, w.unsqueeze(1), b, padding=w.shape[-1] - 1, groups=w.shape[0])
        return F.silu(out[..., : x.shape[-1]])

    return [
        AutocastCase(
            "causal_conv1d",
            lambda x, w, b: family.causal_conv1d(x, w, b, activation="silu"),
            causal_conv1d_torch,
            [
                (rand(2, D, 10), rand(D, 4), rand(D)),
                (rand(2, D, 10, dtype=LOW), rand(D, 4), rand(D)),
            ],
        )
    ]


def row_reduction_cases() -> list:
    """causal_conv1d: the weight and bias gradients sum over batch and time
    (tests_py/test_threads.py)."""
    from ._threads import RowReductionCase, leaves

    x, w, b = leaves((4, 512, 2048), (512, 4), (512,))
    return [
        RowReductionCase(
            "causal_conv1d", lambda: family.causal_conv1d(x, w, b, None, False, "silu"), (x, w, b)
        )
    ]
