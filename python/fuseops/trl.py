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
- The entropy has no gradient: a loss that uses it (GRPO's entropy bonus,
  ``entropy_coef != 0``) raises an error in its backward naming this
  module; ``revert()`` brings TRL's head back for such runs. Using the
  entropy for metrics or masks is unaffected.
"""

from __future__ import annotations

from typing import Optional

import torch

from .ops.cross_entropy import linear_cross_entropy_stats

#: TRL's head, kept by apply() for revert().
_trl_function: Optional[type] = None


class _EntropyWithoutGradient(torch.autograd.Function):
    """The entropy, attached to the hidden states so that a gradient reaching
    it raises instead of vanishing."""

    @staticmethod
    def forward(ctx, entropy: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return entropy.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if grad is not None and bool(grad.ne(0).any()):
            raise RuntimeError(
                "fuseops.trl: the entropy of fuseops' fused LM head has no gradient, and this "
                "loss uses it (GRPO's entropy bonus: entropy_coef != 0); call "
                "fuseops.trl.revert() to train such a loss with TRL's own head"
            )
        return None, None


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
        with torch.no_grad():
            label_logit = _label_logits(hidden, weight, bias, targets, lse.dtype)
            if softcap is not None:
                label_logit = softcap * torch.tanh(label_logit / softcap)
            exact = label_logit - lse
        # The float32 value, the gradient of -loss (the same derivative).
        log_probs = -loss.to(lse.dtype)
        log_probs = log_probs + (exact - log_probs).detach()
        entropy = log_sum_sq_probs = mean_logits = is_top1 = None
        if "entropy" in outputs:
            entropy = stats[:, 0]
            if torch.is_grad_enabled() and hidden.requires_grad:
                entropy = _EntropyWithoutGradient.apply(entropy, hidden)
        if "mean_logits" in outputs:
            mean_logits = stats[:, 1]
        if "log_sum_sq_probs" in outputs:
            log_sum_sq_probs = stats[:, 2]
        if "is_top1" in outputs:
            is_top1 = predicted == targets
        return log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1


def _label_logits(hidden, weight, bias, targets, dtype) -> torch.Tensor:
    """Each row's logit of its label, ``hidden . weight[label] + bias``,
    summed in ``dtype``."""
    dtype_now = torch.get_autocast_dtype(hidden.device.type)
    if torch.is_autocast_enabled(hidden.device.type):
        # The product's operands as autocast gives them to the GEMMs.
        hidden, weight = hidden.to(dtype_now), weight.to(dtype_now)
        bias = None if bias is None else bias.to(dtype_now)
    rows = weight.index_select(0, targets).to(dtype)
    logit = (hidden.to(dtype) * rows).sum(-1)
    return logit if bias is None else logit + bias.index_select(0, targets).to(dtype)


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
    # the entropy is computed and dropped (it has no gradient).
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

    from .ops._bench_case import Case, Traffic
    from .ops.cross_entropy import _linear_inputs

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
