"""The test and bench cases of :mod:`fuseops.ops.cross_entropy` (see
:mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import cross_entropy as family
from ._sample import DTYPES, Sample, tensor


def _logits_target(rows, vocab, dtype, device, gen):
    logits = torch.randn(rows, vocab, dtype=torch.float32, device=device, generator=gen) * 2
    target = torch.randint(0, vocab, (rows,), device=device, generator=gen)
    return logits.to(dtype), target


def _linear_inputs(rows, vocab, dtype, device, gen):
    # rows x vocab, the shape of the logits that are never formed; hidden
    # size min(2048, vocab), an LM head's.
    hidden = min(2048, vocab)
    x = torch.randn(rows, hidden, dtype=torch.float32, device=device, generator=gen)
    w = torch.randn(vocab, hidden, dtype=torch.float32, device=device, generator=gen) / hidden**0.5
    target = torch.randint(0, vocab, (rows,), device=device, generator=gen)
    return x.to(dtype), w.to(dtype), target


def _torch_linear_cross_entropy(x, w, target):
    # PyTorch's chunked path (options=None would form the logits).
    return F.linear_cross_entropy(x, w, target, options=torch.nn.LinearCrossEntropyOptions())


def bench_cases():
    from ._bench_case import Case, Traffic

    return [
        Case(
            "cross_entropy",
            "cross_entropy",
            "cross_entropy",
            _logits_target,
            forward_traffic=Traffic(rows=1),  # logits in
            backward_traffic=Traffic(rows=2),  # logits in, their gradient out
            native=F.cross_entropy,
            native_label="F.cross_entropy",
            has_out=False,
            differentiable=(0,),
            description="softmax + cross-entropy over the last dimension (rows x classes), mean",
        ),
        Case(
            "cross_entropy_inplace",
            "cross_entropy_inplace",
            "cross_entropy",
            _logits_target,
            forward_traffic=Traffic(rows=2),  # logits in, their gradient out
            backward_traffic=Traffic(rows=2),  # the gradient scaled in place
            native=F.cross_entropy,
            native_label="F.cross_entropy",
            has_out=False,
            differentiable=(0,),
            variant=True,
            description="cross_entropy writing the gradient into the logits (inplace_backward)",
        ),
        Case(
            "linear_cross_entropy",
            "linear_cross_entropy",
            "linear_cross_entropy",
            _linear_inputs,
            # Bound by its GEMMs, not by memory; the least traffic counted is
            # the projection weight [V, H] (H = 2048 "vectors" of V from
            # V = 2048 up), read in the forward, read and its gradient
            # written in the backward.
            forward_traffic=Traffic(rows=0, vectors=2048),
            backward_traffic=Traffic(rows=0, vectors=2 * 2048),
            native=_torch_linear_cross_entropy,
            native_label="F.linear_cross_entropy (chunked)",
            has_out=False,
            differentiable=(0, 1),
            variant=True,
            description="LM head: x [rows, min(2048, V)] @ W.T then cross-entropy, V = hidden",
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops

    def t(shape, dtype=torch.float32, layout="contiguous", grad=False, scale=2.0):
        return tensor(shape, dtype, device, layout, grad, scale)

    def target(shape, vocab, ignore=True):
        tgt = torch.randint(0, vocab, shape, device=device)
        if ignore and tgt.numel() > 1:
            tgt.view(-1)[1] = -100
        return tgt

    ce = ops.cross_entropy.default
    w10 = torch.rand(10, device=device) + 0.5
    x, tg = t((6, 10)), target((6,), 10)
    _, lse, total = family.cross_entropy_forward(x, tg, w10, "mean", -100, 0.1, 1e-3, 3.0)
    result = [
        Sample(ce, (x, tg, None, "mean", -100, 0.0, 0.0, None), family.cross_entropy),
        Sample(
            ce, (t((6, 10), grad=True), tg, w10, "mean", -100, 0.1, 1e-3, 3.0), family.cross_entropy
        ),
        Sample(
            ce,
            (t((6, 10), torch.float64, "transposed", True), tg, None, "sum", -100, 0.0, 0.0, None),
            family.cross_entropy,
        ),
        Sample(
            ce,
            (
                t((2, 3, 17), torch.bfloat16, "sliced", True),
                target((2, 3), 17),
                None,
                "none",
                -100,
                0.2,
                0.0,
                None,
            ),
            family.cross_entropy,
        ),
        Sample(
            ce,
            (
                t((4, 9), torch.float16, grad=True),
                target((4,), 9, ignore=False).int(),
                None,
                "mean",
                2,
                0.0,
                1e-2,
                5.0,
            ),
            family.cross_entropy,
        ),
        Sample(
            ce,
            (t((0, 9), grad=True), target((0,), 9), None, "sum", -100, 0.0, 0.0, None),
            family.cross_entropy,
        ),
        Sample(
            ce,
            (
                t((5, 8), layout="expanded", grad=True),
                target((5,), 8),
                None,
                "mean",
                -100,
                0.0,
                0.0,
                None,
            ),
            family.cross_entropy,
        ),
        Sample(
            ops.cross_entropy_inplace.default,
            (t((6, 10)), tg, w10, "mean", -100, 0.1, 1e-3, 3.0),
            family.cross_entropy_inplace,
        ),
        Sample(
            ops.cross_entropy_inplace.default,
            (
                t((7, 33), torch.bfloat16, "transposed", True),
                target((7,), 33),
                None,
                "none",
                -100,
                0.0,
                0.0,
                None,
            ),
            family.cross_entropy_inplace,
        ),
        Sample(
            ops.cross_entropy_forward.default,
            (x, tg, w10, "mean", -100, 0.1, 1e-3, 3.0),
            family.cross_entropy_forward,
        ),
        Sample(
            ops.cross_entropy_forward.default,
            (t((6, 10), grad=True), tg, None, "none", -100, 0.0, 0.0, None),
            family.cross_entropy_forward,
        ),
        Sample(
            ops.cross_entropy_backward.default,
            (torch.randn((), device=device), x, tg, w10, lse, total, "mean", -100, 0.1, 1e-3, 3.0),
            family.cross_entropy_backward,
        ),
    ]
    lx, lw, lb, lt = (
        t((70, 8), grad=True, scale=1.0),
        t((12, 8), grad=True, scale=0.5),
        t((12,), grad=True),
        target((70,), 12),
    )
    options = ("mean", -100, 0.1, 1e-3, 4.0, None)
    result.append(
        Sample(
            ops.linear_cross_entropy.default,
            (lx, lw, lb, lt, None) + options,
            family.linear_cross_entropy,
            wrapper_args=(lx, lw, lt, lb, None) + options,
        )
    )
    none_options = ("none", -100, 0.0, 1e-3, None, None)
    result.append(
        Sample(
            ops.linear_cross_entropy.default,
            (lx, lw, lb, lt, None) + none_options,
            family.linear_cross_entropy,
            wrapper_args=(lx, lw, lt, lb, None) + none_options,
        )
    )
    fx, fw, ft, cw = t((9, 8)), t((12, 8)), target((9,), 12), torch.rand(12, device=device) + 0.5
    # The forward with every gradient, and with the input's alone (a frozen
    # head) and the softmax statistics.
    for forward_options in (
        ("sum", -100, 0.0, 0.0, None, 4.0, True),
        ("none", -100, 0.0, 1e-3, 3.0, None, False, False, True),
    ):
        result.append(
            Sample(
                ops.linear_cross_entropy_forward.default,
                (fx, fw, None, ft, cw) + forward_options,
                family.linear_cross_entropy_forward,
                wrapper_args=(fx, fw, ft, None, cw) + forward_options,
            )
        )
    # Every argument given: the profiler records the call's arguments as the
    # wrapper passes them (the conformance suite's profiler test compares the shapes).
    for stats_options in (
        options + (True, False),
        ("none", -100, 0.0, 1e-2, None, None, False, False),
        # The softmax statistics, with and without a softcap.
        options + (True, True),
        ("none", -100, 0.0, 0.0, None, None, False, True),
    ):
        result.append(
            Sample(
                ops.linear_cross_entropy_stats.default,
                (lx, lw, lb, lt, None) + stats_options,
                family.linear_cross_entropy_stats,
                wrapper_args=(lx, lw, lt, lb, None) + stats_options,
            )
        )
    for grad, backward_options in (
        (torch.randn((), device=device), ("mean", -100, 0.1, 1e-3, 4.0, None)),
        (torch.randn(9, device=device), ("none", -100, 0.0, 0.0, None, None)),
    ):
        result.append(
            Sample(
                ops.linear_cross_entropy_backward.default,
                (grad, fx, fw, None, ft, cw) + backward_options,
                family.linear_cross_entropy_backward,
                wrapper_args=(grad, fx, fw, ft, None, cw) + backward_options,
            )
        )
    for dtype in DTYPES:
        for shape in [(3, 7), (37, 1000), (5, 4099)]:
            for reduction in ("sum", "none"):
                result.append(
                    Sample(
                        ce,
                        (
                            t(shape, dtype, grad=True),
                            target(shape[:1], shape[1]),
                            None,
                            reduction,
                            -100,
                            0.0,
                            0.0,
                            None,
                        ),
                        family.cross_entropy,
                        large=True,
                    )
                )
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    ops, vocab, reduction = torch.ops.fuseops, d.int(1, 12), d.choice(("mean", "sum", "none"))
    options = (
        d.choice((-100, 0)),
        d.choice((0.0, 0.1)),
        d.choice((0.0, 1e-3)),
        d.choice((None, 4.0)),
    )
    if d.flag():
        rows = d.size()
        x = d.tensor((rows, d.int(1, 9)), grad=True)
        w = d.tensor((vocab, x.shape[1]), x.dtype, 0.5, grad=True)
        bias, weight = (
            d.maybe(lambda: d.tensor((vocab,), x.dtype, grad=True)),
            d.maybe(lambda: d.tensor((vocab,), x.dtype).abs()),
        )
        args = (
            x,
            w,
            d.integers((rows,), 0, vocab),
            bias,
            weight,
            d.choice(("mean", "sum", "none")),
        ) + options
        normalizer = d.choice((None, 3.0)) if args[5] == "sum" else None
        return Sample(
            ops.linear_cross_entropy.default,
            (x, w, bias, args[2], weight) + args[5:] + (normalizer,),
            family.linear_cross_entropy,
            wrapper_args=args + (normalizer,),
        )
    logits = d.tensor(d.shape(0, 2, hi=6) + (vocab,), scale=2.0, grad=True, writable=True)
    target = d.integers(logits.shape[:-1], 0, vocab, d.choice((torch.int64, torch.int32)))
    weight = d.maybe(lambda: d.tensor((vocab,), logits.dtype).abs())
    if d.flag():
        return Sample(
            ops.cross_entropy.default,
            (logits, target, weight, reduction) + options,
            family.cross_entropy,
        )
    inputs = (logits.detach(), target, weight, reduction) + options
    return Sample(ops.cross_entropy_inplace.default, inputs, family.cross_entropy_inplace)


def autocast_cases() -> list:
    """cross_entropy and the fused LM head under CPU autocast against the compositions they replace, as Trainer(bf16=True) runs an LM head: a float32 head weight with bfloat16 or float32 hidden states; with the loss outputs, the loss and the z-loss term in float32 and the accuracy of the bfloat16 logits (tests_py/test_autocast.py)."""
    import torch.nn.functional as F

    from ._autocast import LOW, AutocastCase, D, rand

    def target(classes: int, rows: int = 8) -> torch.Tensor:
        return torch.randint(0, classes, (rows,))

    def linear_loss_outputs_torch(x, w, b, t):
        # (loss, z-loss term, token accuracy) of F.cross_entropy on the
        # logits F.linear forms under autocast.
        logits = F.linear(x, w, b)
        z = 1e-3 * torch.logsumexp(logits.float(), -1).square().mean()
        return F.cross_entropy(logits, t) + z, z, (logits.argmax(-1) == t).float().mean()

    return [
        AutocastCase(
            "linear_cross_entropy",
            lambda x, w, b, t: family.linear_cross_entropy(x, w, t, b, label_smoothing=0.1),
            lambda x, w, b, t: F.cross_entropy(F.linear(x, w, b), t, label_smoothing=0.1),
            [
                (rand(8, D, dtype=LOW), rand(2 * D, D), None, target(2 * D)),
                (rand(8, D), rand(2 * D, D), rand(2 * D), target(2 * D)),
                (rand(8, D, dtype=LOW), rand(2 * D, D, dtype=LOW), None, target(2 * D)),
            ],
        ),
        AutocastCase(
            "linear_cross_entropy_stats",
            lambda x, w, b, t: tuple(
                family.linear_cross_entropy(
                    x, w, t, b, z_loss=1e-3, return_z_loss=True, return_token_accuracy=True
                )[:3]
            ),
            linear_loss_outputs_torch,
            [
                (rand(8, D, dtype=LOW), rand(2 * D, D), None, target(2 * D)),
                (rand(8, D), rand(2 * D, D), rand(2 * D), target(2 * D)),
            ],
        ),
        AutocastCase(
            "cross_entropy",
            lambda x, t: family.cross_entropy(x, t, label_smoothing=0.1),
            lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
            [(rand(4, D), target(D, 4)), (rand(4, D, dtype=LOW), target(D, 4))],
        ),
    ]


def row_reduction_cases() -> list:
    """cross_entropy's mean loss and linear_cross_entropy's weight gradient
    sum over rows (tests_py/test_threads.py)."""
    from ._threads import RowReductionCase, leaves

    logits, x, w = leaves((4096, 1000), (4096, 256), (1000, 256))
    target = torch.randint(0, 1000, (4096,), generator=torch.Generator().manual_seed(0))
    return [
        RowReductionCase("cross_entropy", lambda: family.cross_entropy(logits, target), (logits,)),
        RowReductionCase(
            "linear_cross_entropy", lambda: family.linear_cross_entropy(x, w, target), (x, w)
        ),
    ]
