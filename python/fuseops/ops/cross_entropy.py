"""Fused softmax + cross-entropy over the last dimension, its forward/backward
ops, the variant that writes the gradient into the logits, and
linear_cross_entropy (the LM head's projection and cross-entropy without the
[N, V] logits). One op family: linear_cross_entropy runs cross_entropy's row
kernel on chunks of logits computed by GEMMs."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from ._sample import DTYPES, Sample, tensor


class CrossEntropyOutput(NamedTuple):
    """What :func:`cross_entropy` and :func:`linear_cross_entropy` return when
    one of their ``return_*`` flags is set; a field not asked for is None.

    - ``loss``: the loss, as without the flags (z-loss term included).
    - ``z_loss``: the z-loss term alone, ``z_loss * logsumexp(z)**2`` per
      non-ignored row, reduced as the loss is (``"mean"``: divided by the
      summed class weights of the non-ignored targets, the loss's divisor,
      which is the count of those targets without class weights; ``"sum"``:
      divided by ``normalizer`` when given; ``"none"``: per row, 0 on ignored
      rows), in the loss's dtype; not differentiable (the loss carries its
      gradient).
    - ``token_accuracy``: the fraction of non-ignored rows whose predicted
      class is the target (0-d float32; NaN when every target is ignored).
    - ``predicted_tokens``: the predicted class of every row, the argmax of
      its logits (first index among ties), shape of ``target``, int64. With a
      ``softcap`` it is the argmax of the logits before the cap (the cap is
      monotone: it can only tie values that differ in the logits)."""

    loss: torch.Tensor
    z_loss: Optional[torch.Tensor] = None
    token_accuracy: Optional[torch.Tensor] = None
    predicted_tokens: Optional[torch.Tensor] = None


def _outputs(
    loss: torch.Tensor,
    lse: torch.Tensor,
    predicted: Optional[torch.Tensor],
    target: torch.Tensor,
    weight: Optional[torch.Tensor],
    reduction: str,
    ignore_index: int,
    z_loss: float,
    normalizer: Optional[float],
    return_z_loss: bool,
    return_token_accuracy: bool,
    return_predicted_tokens: bool,
) -> CrossEntropyOutput:
    """The CrossEntropyOutput of a call from its loss, its per-row logsumexp
    (0 on ignored rows) and its predicted classes."""
    valid = target != ignore_index
    z = None
    if return_z_loss:
        rows = (z_loss * lse.detach().square()).reshape(target.shape)
        if reduction == "none":
            z = rows
        elif reduction == "sum":
            z = rows.sum() / normalizer if normalizer is not None else rows.sum()
        else:
            if weight is None:
                divisor = valid.sum()
            else:
                divisor = (weight.to(lse.dtype)[target.long().clamp(min=0)] * valid).sum()
            z = rows.sum() / divisor
        z = z.to(loss.dtype)
    accuracy = None
    if return_token_accuracy:
        assert predicted is not None
        correct = ((predicted == target) & valid).sum()
        accuracy = correct.float() / valid.sum().float()
    tokens = None
    if return_predicted_tokens:
        assert predicted is not None
        tokens = predicted.reshape(target.shape)
    return CrossEntropyOutput(loss, z, accuracy, tokens)


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
    *,
    inplace_backward: bool = False,
    return_z_loss: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
):
    """``F.cross_entropy(logits, target, weight, ignore_index=ignore_index,
    reduction=reduction, label_smoothing=label_smoothing)`` with the classes in
    the **last** dimension: ``logits`` ``[..., V]`` (float32/float64/bfloat16/
    float16, computed in float32), ``target`` ``[...]`` class indices (int64
    or int32). ``mean`` divides by the summed weights of the non-ignored
    targets (NaN if all are ignored), as torch does. Extensions:
    ``z_loss`` adds ``z_loss * logsumexp(z)**2`` to each non-ignored row
    (PaLM's auxiliary loss; not multiplied by the class weight), ``softcap``
    ``c`` uses ``z = c * tanh(logits / c)`` as the logits.

    ``inplace_backward=True`` saves the ``[..., V]`` gradient allocation: the
    forward writes the gradient into ``logits`` (its values are gone after
    the call; nothing else may use them) and the backward scales it there by
    grad_output; that backward runs at most once. Differentiable in
    ``logits`` (not in ``weight``).

    ``return_z_loss``, ``return_token_accuracy``, ``return_predicted_tokens``:
    return a :class:`CrossEntropyOutput` with those fields too (the z-loss
    term from the logsumexp the loss computes; the predicted classes from an
    argmax of ``logits``, before an in-place backward overwrites them).
    ``return_z_loss`` needs ``inplace_backward=False``."""
    ops = torch.ops.fuseops
    options = (weight, reduction, ignore_index, label_smoothing, z_loss, softcap)
    if not (return_z_loss or return_token_accuracy or return_predicted_tokens):
        op = ops.cross_entropy_inplace if inplace_backward else ops.cross_entropy
        return op(logits, target, *options)
    predicted = None
    if return_token_accuracy or return_predicted_tokens:
        with torch.no_grad():
            predicted = logits.argmax(-1)
    if inplace_backward:
        if return_z_loss:
            raise ValueError(
                "fuseops.cross_entropy: return_z_loss=True needs inplace_backward=False (the "
                "in-place op does not keep the logsumexp the z-loss is made of)"
            )
        loss = ops.cross_entropy_inplace(logits, target, *options)
        lse = loss.new_zeros(())
    else:
        loss, lse, _ = ops.cross_entropy_forward(logits, target, *options)
    return _outputs(
        loss,
        lse,
        predicted,
        target,
        weight,
        reduction,
        ignore_index,
        z_loss,
        None,
        return_z_loss,
        return_token_accuracy,
        return_predicted_tokens,
    )


def cross_entropy_inplace(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
) -> torch.Tensor:
    """``cross_entropy(..., inplace_backward=True)``: the loss, with the
    gradient of the loss written into ``logits`` (see :func:`cross_entropy`)."""
    return torch.ops.fuseops.cross_entropy_inplace(
        logits, target, weight, reduction, ignore_index, label_smoothing, z_loss, softcap
    )


def cross_entropy_forward(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, lse, total_weight)``: the loss of :func:`cross_entropy`, the
    per-row logsumexp of the (softcapped) logits (shape ``target.shape``,
    float32; float64 for float64 logits; 0 on ignored rows) and the summed
    weights of the non-ignored targets (0-d, the mean's divisor), which
    :func:`cross_entropy_backward` takes. Only the loss is differentiable."""
    return torch.ops.fuseops.cross_entropy_forward(
        logits, target, weight, reduction, ignore_index, label_smoothing, z_loss, softcap
    )


def cross_entropy_backward(
    grad_output: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor],
    lse: torch.Tensor,
    total_weight: torch.Tensor,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
) -> torch.Tensor:
    """The gradient of :func:`cross_entropy` with respect to ``logits``, in
    one pass: the softmax is recomputed from ``logits`` and ``lse``."""
    return torch.ops.fuseops.cross_entropy_backward(
        grad_output,
        logits,
        target,
        weight,
        lse,
        total_weight,
        reduction,
        ignore_index,
        label_smoothing,
        z_loss,
        softcap,
    )


def linear_cross_entropy(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: Optional[torch.Tensor] = None,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
    normalizer: Optional[float] = None,
    *,
    return_z_loss: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
):
    """``cross_entropy(F.linear(input, linear_weight, linear_bias), target,
    weight, ...)`` (arguments named as ``F.linear_cross_entropy``) without the
    ``[N, V]`` logits: ``input`` ``[N, H]``, ``linear_weight`` ``[V, H]``,
    ``target`` ``[N]``. Tokens go in chunks whose logits are about 4 times the size
    of ``input``. With ``reduction`` ``"mean"`` or ``"sum"`` the gradients are
    computed in the forward (``linear_weight``'s accumulated in float32) and
    scaled by grad_output in the backward, which runs at most once; with
    ``"none"`` (a loss per token, ``[N]``) the backward recomputes each
    chunk's logits (one GEMM more, any number of backward passes), which also
    makes a per-token weighting ``(loss * token_weight).sum()`` exact; with
    ``"none"`` and a frozen head (``linear_weight`` and ``linear_bias`` not
    requiring gradients, as LoRA leaves an LM head) the forward computes each
    token's input gradient and the backward only scales it (two GEMMs per
    chunk instead of three). With
    ``"sum"``, ``normalizer`` divides loss and gradients (gradient
    accumulation over micro-batches). Every option of :func:`cross_entropy`
    applies. Differentiable in ``input``, ``linear_weight``, ``linear_bias``.

    ``return_z_loss``, ``return_token_accuracy``, ``return_predicted_tokens``:
    return a :class:`CrossEntropyOutput` with those fields too, computed in
    the same pass over the chunks (the predicted classes are the argmax of
    each chunk's logits, taken before the gradient overwrites them)."""
    options = (
        weight,
        reduction,
        ignore_index,
        label_smoothing,
        z_loss,
        softcap,
        normalizer,
    )
    if not (return_z_loss or return_token_accuracy or return_predicted_tokens):
        return torch.ops.fuseops.linear_cross_entropy(
            input, linear_weight, linear_bias, target, *options
        )
    loss, lse, predicted, _ = torch.ops.fuseops.linear_cross_entropy_stats(
        input,
        linear_weight,
        linear_bias,
        target,
        *options,
        return_token_accuracy or return_predicted_tokens,
    )
    return _outputs(
        loss,
        lse,
        predicted,
        target,
        weight,
        reduction,
        ignore_index,
        z_loss,
        normalizer,
        return_z_loss,
        return_token_accuracy,
        return_predicted_tokens,
    )


#: linear_cross_entropy_stats is linear_cross_entropy with more outputs: its
#: gradients are that op's backward.
BACKWARD_OPS: dict[str, Optional[str]] = {
    "linear_cross_entropy_stats": "linear_cross_entropy_backward"
}


def linear_cross_entropy_stats(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: Optional[torch.Tensor] = None,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
    normalizer: Optional[float] = None,
    predict: bool = False,
    softmax_stats: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, lse, predicted, softmax_stats)``: the loss of
    :func:`linear_cross_entropy` (differentiable as there), the per-row
    logsumexp of the (softcapped) logits (``[N]`` float32, float64 for float64
    input, 0 on ignored rows), when ``predict`` the argmax of every row's
    logits (``[N]`` int64, the first of equal maxima; empty otherwise), and
    when ``softmax_stats`` three statistics of every row's distribution, of
    ``z = softcap(logits)`` and ``p = softmax(z)``: column 0 the entropy
    ``-sum p log p``, column 1 the mean logit ``sum z / V``, column 2
    ``log sum p**2`` (``[N, 3]`` in ``lse``'s dtype, 0 on ignored rows, not
    differentiable; ``[0, 3]`` otherwise). The statistics cost one more read
    of each chunk's logits (in blocks of rows with float32 temporaries of
    about 16 MiB each). :func:`linear_cross_entropy`'s ``return_*`` flags
    and ``fuseops.trl`` are built on it."""
    return torch.ops.fuseops.linear_cross_entropy_stats(
        input,
        linear_weight,
        linear_bias,
        target,
        weight,
        reduction,
        ignore_index,
        label_smoothing,
        z_loss,
        softcap,
        normalizer,
        predict,
        softmax_stats,
    )


def linear_cross_entropy_forward(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: Optional[torch.Tensor] = None,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
    normalizer: Optional[float] = None,
    predict: bool = False,
    weight_grad: bool = True,
    softmax_stats: bool = False,
) -> tuple[
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
]:
    """``(loss, grad_input, grad_linear_weight, grad_linear_bias, lse,
    predicted, softmax_stats)`` of :func:`linear_cross_entropy` for a
    grad_output of 1 (of ones with ``reduction="none"``: row ``i`` of
    ``grad_input`` is then the gradient of loss ``i`` alone;
    ``grad_linear_bias`` is empty without a bias; both head gradients are
    empty without ``weight_grad``, a frozen head, which saves a GEMM per
    chunk), then ``lse``, ``predicted`` and ``softmax_stats`` as
    :func:`linear_cross_entropy_stats` gives them; not differentiable."""
    return torch.ops.fuseops.linear_cross_entropy_forward(
        input,
        linear_weight,
        linear_bias,
        target,
        weight,
        reduction,
        ignore_index,
        label_smoothing,
        z_loss,
        softcap,
        normalizer,
        predict,
        weight_grad,
        softmax_stats,
    )


def linear_cross_entropy_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: Optional[torch.Tensor] = None,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
    normalizer: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(grad_input, grad_linear_weight, grad_linear_bias)`` of
    :func:`linear_cross_entropy` for ``grad_output`` of the loss's shape
    (``[N]`` with ``reduction="none"``: a weight per token), recomputing the
    logits chunk by chunk (``grad_linear_bias`` is empty without a bias); not
    differentiable."""
    return torch.ops.fuseops.linear_cross_entropy_backward(
        grad_output,
        input,
        linear_weight,
        linear_bias,
        target,
        weight,
        reduction,
        ignore_index,
        label_smoothing,
        z_loss,
        softcap,
        normalizer,
    )


def cross_entropy_reference(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
) -> torch.Tensor:
    # The target may arrive as floats from a harness that widens every input.
    target = target.long()
    if weight is not None:
        weight = weight.to(logits.dtype)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    flat = logits.reshape(-1, logits.shape[-1])
    loss = F.cross_entropy(
        flat,
        target.reshape(-1),
        weight,
        ignore_index=ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
    )
    if z_loss:
        lse = torch.logsumexp(flat, dim=-1)
        valid = target.reshape(-1) != ignore_index
        z = z_loss * lse.square() * valid
        if reduction == "none":
            loss = loss + z
        elif reduction == "sum":
            loss = loss + z.sum()
        else:
            divisor = valid.sum() if weight is None else weight[target.reshape(-1)[valid]].sum()
            loss = loss + z.sum() / divisor
    return loss.reshape(target.shape) if reduction == "none" else loss


def cross_entropy_inplace_reference(*args) -> torch.Tensor:
    # The loss; the gradient the op leaves in the logits is test_cross_entropy's.
    return cross_entropy_reference(*args)


def linear_cross_entropy_reference(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: Optional[torch.Tensor] = None,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
    normalizer: Optional[float] = None,
) -> torch.Tensor:
    loss = cross_entropy_reference(
        F.linear(input, linear_weight, linear_bias),
        target,
        weight,
        reduction,
        ignore_index,
        label_smoothing,
        z_loss,
        softcap,
    )
    return loss / normalizer if normalizer is not None else loss


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
    _, lse, total = cross_entropy_forward(x, tg, w10, "mean", -100, 0.1, 1e-3, 3.0)
    result = [
        Sample(ce, (x, tg, None, "mean", -100, 0.0, 0.0, None), cross_entropy),
        Sample(ce, (t((6, 10), grad=True), tg, w10, "mean", -100, 0.1, 1e-3, 3.0), cross_entropy),
        Sample(
            ce,
            (t((6, 10), torch.float64, "transposed", True), tg, None, "sum", -100, 0.0, 0.0, None),
            cross_entropy,
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
            cross_entropy,
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
            cross_entropy,
        ),
        Sample(
            ce,
            (t((0, 9), grad=True), target((0,), 9), None, "sum", -100, 0.0, 0.0, None),
            cross_entropy,
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
            cross_entropy,
        ),
        Sample(
            ops.cross_entropy_inplace.default,
            (t((6, 10)), tg, w10, "mean", -100, 0.1, 1e-3, 3.0),
            cross_entropy_inplace,
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
            cross_entropy_inplace,
        ),
        Sample(
            ops.cross_entropy_forward.default,
            (x, tg, w10, "mean", -100, 0.1, 1e-3, 3.0),
            cross_entropy_forward,
        ),
        Sample(
            ops.cross_entropy_forward.default,
            (t((6, 10), grad=True), tg, None, "none", -100, 0.0, 0.0, None),
            cross_entropy_forward,
        ),
        Sample(
            ops.cross_entropy_backward.default,
            (torch.randn((), device=device), x, tg, w10, lse, total, "mean", -100, 0.1, 1e-3, 3.0),
            cross_entropy_backward,
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
            linear_cross_entropy,
            wrapper_args=(lx, lw, lt, lb, None) + options,
        )
    )
    none_options = ("none", -100, 0.0, 1e-3, None, None)
    result.append(
        Sample(
            ops.linear_cross_entropy.default,
            (lx, lw, lb, lt, None) + none_options,
            linear_cross_entropy,
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
                linear_cross_entropy_forward,
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
                linear_cross_entropy_stats,
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
                linear_cross_entropy_backward,
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
                        cross_entropy,
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
            linear_cross_entropy,
            wrapper_args=args + (normalizer,),
        )
    logits = d.tensor(d.shape(0, 2, hi=6) + (vocab,), scale=2.0, grad=True, writable=True)
    target = d.integers(logits.shape[:-1], 0, vocab, d.choice((torch.int64, torch.int32)))
    weight = d.maybe(lambda: d.tensor((vocab,), logits.dtype).abs())
    if d.flag():
        return Sample(
            ops.cross_entropy.default, (logits, target, weight, reduction) + options, cross_entropy
        )
    inputs = (logits.detach(), target, weight, reduction) + options
    return Sample(ops.cross_entropy_inplace.default, inputs, cross_entropy_inplace)


# --- export (fuseops/ops/_export.py) ---

NOT_EXPORTED = {
    (
        "cross_entropy",
        "cross_entropy_inplace",
        "linear_cross_entropy",
        "linear_cross_entropy_stats",
    ): "losses (training); an inference graph returns logits",
}


def autocast_cases() -> list:
    """cross_entropy and the fused LM head under CPU autocast against the compositions they replace, as Trainer(bf16=True) runs an LM head: a float32 head weight with bfloat16 or float32 hidden states; with the loss outputs, the loss and the z-loss term in float32 and the accuracy of the bfloat16 logits (tests_py/test_autocast.py)."""
    import torch.nn.functional as F

    from ._autocast import D, LOW, AutocastCase, rand

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
            lambda x, w, b, t: linear_cross_entropy(x, w, t, b, label_smoothing=0.1),
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
                linear_cross_entropy(
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
            lambda x, t: cross_entropy(x, t, label_smoothing=0.1),
            lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
            [(rand(4, D), target(D, 4)), (rand(4, D, dtype=LOW), target(D, 4))],
        ),
    ]


__all__ = [
    "CrossEntropyOutput",
    "cross_entropy",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "cross_entropy_inplace",
    "linear_cross_entropy",
    "linear_cross_entropy_backward",
    "linear_cross_entropy_forward",
    "linear_cross_entropy_stats",
]


def row_reduction_cases() -> list:
    """cross_entropy's mean loss and linear_cross_entropy's weight gradient
    sum over rows (tests_py/test_threads.py)."""
    from ._threads import RowReductionCase, leaves

    logits, x, w = leaves((4096, 1000), (4096, 256), (1000, 256))
    target = torch.randint(0, 1000, (4096,), generator=torch.Generator().manual_seed(0))
    return [
        RowReductionCase("cross_entropy", lambda: cross_entropy(logits, target), (logits,)),
        RowReductionCase(
            "linear_cross_entropy", lambda: linear_cross_entropy(x, w, target), (x, w)
        ),
    ]
