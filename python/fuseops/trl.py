"""TRL's trainers with fuseops' fused LM head: ``fuseops.trl.apply()``.

TRL's trainers (``SFTTrainer``, ``DPOTrainer``, ``KTOTrainer``,
``GRPOTrainer``, ``RLOOTrainer``) score tokens through one fused LM head
(``trl.trainer.utils.add_fused_lm_head``): the per-token log-probabilities
of the labels, and per trainer the entropy, the mean logit, whether the
label is the argmax and ``log sum p**2``, computed chunk by chunk without
the ``[tokens, vocab]`` logits. ``apply()`` makes that head run on
:func:`fuseops.linear_cross_entropy_stats` (fuseops' chunked GEMMs and
float32 row statistics; on CPUs that emulate bfloat16 products, the
products in float32 on widened operands). ``revert()`` restores TRL's.

Semantics, as TRL's head computes them: ``z = softcap * tanh(logit_scale *
logits / softcap) / temperature`` (without the softcap, ``logit_scale *
logits / temperature``) and ``p = softmax(z)``; log-probabilities and the
statistics are float32 (float64 for float64 hidden states). Where fuseops
differs, on purpose:

- ``logit_scale / temperature`` scales the hidden states (and the bias)
  before the product instead of the logits after it: exact when the factor
  is 1 (the default of every TRL trainer and most models), otherwise one
  more rounding of the hidden states to their dtype (2^-9 relative in
  bfloat16).
- The log-probabilities' values are the label's logit (a float32 dot
  product) minus the float32 logsumexp: TRL rounds each logit to the
  product's dtype first.
- The entropy's gradient (a loss that uses it: GRPO's entropy bonus,
  ``entropy_coef != 0``) recomputes the logits a block of rows at a time
  in the backward, in the tensors' own dtypes (autocast off), with three
  more products per block: what TRL's head costs for it, on fuseops'
  products. Only rows with a nonzero gradient are recomputed.
"""

from __future__ import annotations

from typing import Optional

import torch

from .ops.cross_entropy import linear_cross_entropy_stats
from .ops.linear import linear
from .preference import exact_log_probs

#: TRL's head, kept by apply() for revert().
_trl_function: Optional[type] = None


#: Rows of one block of the entropy's backward: its float32 temporaries of
#: [rows, vocab] stay around 32 MiB each.
_ENTROPY_BLOCK_FLOATS = 1 << 23


class _Entropy(torch.autograd.Function):
    """Each row's entropy ``H = -sum p log p`` of ``z = softcap(hidden @
    weight.T + bias)``, its value the fused head's statistic. The fused
    head keeps no logits, so the backward (run only when a loss uses the
    entropy: GRPO's entropy bonus) recomputes them a block of rows at a
    time with ``fuseops.linear`` and differentiates ``H`` there: ``dH/dz =
    -p (log p + H)``, three products per block."""

    @staticmethod
    def forward(ctx, entropy, hidden, weight, bias, softcap):
        ctx.save_for_backward(hidden, weight, bias)
        ctx.softcap = softcap
        return entropy.clone()

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, bias = ctx.saved_tensors
        wanted = ctx.needs_input_grad[1:4]
        grads = _entropy_backward(grad, hidden, weight, bias, ctx.softcap, wanted)
        return (None, *grads, None)


def _entropy_backward(grad, hidden, weight, bias, softcap, wanted):
    """The gradients of ``sum(grad * H)`` with respect to the wanted ones of
    (hidden, weight, bias), in their dtypes; the weight's and bias's summed
    over the blocks in float32 (float64 for float64). Autocast is off: the recomputed products are
    in the tensors' own dtype."""
    want_hidden, want_weight, want_bias = wanted
    block = max(32, _ENTROPY_BLOCK_FLOATS // weight.shape[0])
    grad_hidden = torch.zeros_like(hidden) if want_hidden else None
    wide = {"dtype": torch.promote_types(weight.dtype, torch.float32), "device": weight.device}
    grad_weight = torch.zeros(weight.shape, **wide) if want_weight else None
    grad_bias = torch.zeros(bias.shape, **wide) if want_bias else None
    with torch.enable_grad(), torch.autocast(hidden.device.type, enabled=False):
        w = weight.detach().requires_grad_(want_weight)
        b = None if bias is None else bias.detach().requires_grad_(want_bias)
        for start in range(0, hidden.shape[0], block):
            g = grad[start : start + block]
            if not bool(g.ne(0).any()):
                continue  # rows the loss does not weigh (padding, a zero coefficient)
            h = hidden[start : start + block].detach().requires_grad_(want_hidden)
            z = linear(h, w, b)
            z = z.to(torch.promote_types(z.dtype, torch.float32))
            if softcap is not None:
                z = softcap * torch.tanh(z / softcap)
            log_p = torch.log_softmax(z, -1)
            entropy = -(log_p.exp() * log_p).sum(-1)
            leaves = [t for t, want in zip((h, w, b), wanted) if want]
            found = iter(torch.autograd.grad(entropy, leaves, g.to(entropy.dtype)))
            if grad_hidden is not None:
                grad_hidden[start : start + block] = next(found)
            if grad_weight is not None:
                grad_weight += next(found)
            if grad_bias is not None:
                grad_bias += next(found)
    return (
        grad_hidden,
        None if grad_weight is None else grad_weight.to(weight.dtype),
        None if grad_bias is None else grad_bias.to(bias.dtype),
    )


class ChunkedLogProbs:
    """A drop-in for ``trl.kernels.ChunkedLogProbFunction``: ``apply`` takes
    its arguments and returns its five outputs ``(log_probs, entropy,
    log_sum_sq_probs, mean_logits, is_top1)``, each None unless named in
    ``outputs`` (log-probabilities always)."""

    @staticmethod
    def apply(
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: Optional[torch.Tensor],
        targets: torch.Tensor,
        temperature: float,
        chunk_size: int,
        final_logit_softcapping: Optional[float] = None,
        logit_scale: float = 1.0,
        outputs: tuple = ("log_probs",),
    ):
        del chunk_size  # fuseops sizes its chunks from the input (linear_cross_entropy)
        if not temperature > 0:
            raise ValueError(f"fuseops.trl: temperature must be > 0, got {temperature}")
        if not torch.is_autocast_enabled(hidden.device.type) and weight.dtype != hidden.dtype:
            # TRL's head casts each block of the weight to the hidden states'
            # dtype (cast_lm_head_to_fp32: float32 hidden states, bfloat16 head).
            weight = weight.to(hidden.dtype)
            bias = None if bias is None else bias.to(hidden.dtype)
        factor = logit_scale / temperature
        softcap = None if final_logit_softcapping is None else final_logit_softcapping / temperature
        if factor != 1.0:
            # z = c tanh(s y / c) / T = (c / T) tanh((s / T) y / (c / T)): the
            # factor on the product, the softcap divided by T.
            hidden = hidden * factor
            bias = None if bias is None else bias * factor
        targets = targets.long()
        loss, lse, predicted, stats = linear_cross_entropy_stats(
            hidden,
            weight,
            targets,
            bias,
            reduction="none",
            softcap=softcap,
            predict="is_top1" in outputs,
            softmax_stats=any(
                name in outputs for name in ("entropy", "mean_logits", "log_sum_sq_probs")
            ),
        )
        # The float32 value, the gradient of -loss.
        log_probs = exact_log_probs(loss, lse, hidden, weight, bias, targets, softcap=softcap)
        entropy = log_sum_sq_probs = mean_logits = is_top1 = None
        if "entropy" in outputs:
            entropy = stats[:, 0]
            differentiable = (hidden, weight) if bias is None else (hidden, weight, bias)
            if torch.is_grad_enabled() and any(t.requires_grad for t in differentiable):
                entropy = _Entropy.apply(entropy, hidden, weight, bias, softcap)
        if "mean_logits" in outputs:
            mean_logits = stats[:, 1]
        if "log_sum_sq_probs" in outputs:
            log_sum_sq_probs = stats[:, 2]
        if "is_top1" in outputs:
            is_top1 = predicted == targets
        return log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1


def apply() -> None:
    """Make every TRL trainer's fused LM head fuseops' (idempotent). Call
    before the trainer's first step; the trainers look the head up on each
    forward."""
    global _trl_function
    import trl.trainer.utils as trl_utils

    if trl_utils._ChunkedLogProbFunction is ChunkedLogProbs:
        return
    _trl_function = trl_utils._ChunkedLogProbFunction
    trl_utils._ChunkedLogProbFunction = ChunkedLogProbs


def revert() -> None:
    """Give TRL its own fused LM head back (a no-op without apply())."""
    global _trl_function
    import trl.trainer.utils as trl_utils

    if _trl_function is not None:
        trl_utils._ChunkedLogProbFunction = _trl_function
        _trl_function = None


# --- bench: python -m fuseops bench --ops trl_log_probs,trl_log_probs_frozen_head
# (collected by fuseops.bench.cases beside the op modules' cases) ---

#: What TRL's GRPO and SFT trainers ask of their LM head besides the labels'
#: log-probabilities.
_BENCH_OUTPUTS = ("log_probs", "entropy")


def _bench_fuseops(x, w, target):
    # fuseops' head as TRL's trainers call it (temperature 1, no softcap);
    # the entropy is computed and not used by the loss.
    return ChunkedLogProbs.apply(x, w, None, target, 1.0, 32768, None, 1.0, _BENCH_OUTPUTS)[0]


def _bench_trl(x, w, target):
    # TRL's own head (its default vocabulary tile of 32768).
    from trl.kernels import ChunkedLogProbFunction

    return ChunkedLogProbFunction.apply(x, w, None, target, 1.0, 32768, None, 1.0, _BENCH_OUTPUTS)[
        0
    ]


def _bench_reference(x, w, target):
    # The target may arrive as floats from a harness that widens every input.
    logits = torch.nn.functional.linear(x, w)
    return torch.log_softmax(logits, -1).gather(-1, target.long()[:, None]).squeeze(-1)


def bench_cases():
    """TRL's head with the LM head trained (full fine-tuning) and frozen
    (LoRA), against TRL's own head and the eager log-softmax of the
    materialised logits."""
    import importlib.util

    from .ops.cases._bench_case import Case, Traffic
    from .ops.cases.cross_entropy import _linear_inputs

    has_trl = importlib.util.find_spec("trl") is not None
    return [
        Case(
            name,
            _bench_fuseops,
            _bench_reference,
            _linear_inputs,
            forward_traffic=Traffic(rows=0, vectors=2048),
            backward_traffic=Traffic(rows=0, vectors=(2 if head == "trained" else 1) * 2048),
            native=_bench_trl if has_trl else None,
            native_label="TRL's chunked LM head (trl.kernels.ChunkedLogProbFunction)",
            has_out=False,
            differentiable=differentiable,
            variant=True,
            description=f"TRL's trainers' LM head (fuseops.trl), {head}: per-token "
            "log-probabilities and entropy of x [rows, min(2048, V)] @ W.T, V = hidden",
        )
        for name, head, differentiable in (
            ("trl_log_probs", "trained", (0, 1)),
            ("trl_log_probs_frozen_head", "frozen", (0,)),
        )
    ]


__all__ = ["ChunkedLogProbs", "apply", "revert"]
