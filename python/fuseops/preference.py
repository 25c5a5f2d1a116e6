"""Preference-optimisation and RL losses fused with the LM head: DPO, IPO,
hinge, SimPO, CPO, ORPO, KTO and GRPO without the ``[tokens, vocab]``
logits.

Every one of them is a function of the sequences' log-probabilities of
their completion tokens, ``log p(target | prefix)`` summed (or averaged)
over each sequence. :func:`token_log_probs` gives the per-token values in
float32 from the hidden states and the head's weight chunk by chunk
(``fuseops.linear_cross_entropy_stats(..., reduction="none")``: float32
statistics, no ``[N, V]`` logits, in the forward or in the backward, which
recomputes each chunk's logits with its tokens' gradients), so each loss
here is that op followed by a few operations on ``[batch]`` tensors. Their
gradients are exact: the backward of the per-token losses receives, per
token, the gradient of the preference loss with respect to that token's
log-probability.

Layout (as TRL's trainers and Liger-Kernel's fused losses take it): the
batch holds the chosen sequences first, then the rejected ones, in the same
order: ``input`` ``[2B, T, H]`` (or ``[2B * T, H]``), ``target``
``[2B, T]``, already shifted (``target[:, t]`` is the token that follows
position ``t``), ``ignore_index`` on the prompt and padding positions.
Definitions and defaults follow TRL (``DPOConfig``, ``CPOConfig``,
``ORPOConfig``); where TRL's have changed between versions the docstrings
say which form is computed.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from .ops.cross_entropy import linear_cross_entropy_stats


class PreferenceOutput(NamedTuple):
    """What the fused preference losses return.

    - ``loss``: the loss, averaged over the B pairs (differentiable).
    - ``chosen_rewards`` / ``rejected_rewards``: ``[B]``, the implicit rewards
      TRL logs (DPO: ``beta * (logp - ref_logp)``; SimPO and CPO: ``beta *
      logp``; ORPO: ``beta * logp``), detached.
    - ``chosen_logps`` / ``rejected_logps``: ``[B]``, the sequences'
      log-probabilities as the loss used them (summed, or averaged per token
      where the loss averages), detached.
    - ``nll_loss``: the chosen sequences' cross-entropy per token (CPO and
      ORPO add it to the loss; None for the others), detached."""

    loss: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor
    chosen_logps: torch.Tensor
    rejected_logps: torch.Tensor
    nll_loss: Optional[torch.Tensor] = None


def token_log_probs(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: Optional[torch.Tensor] = None,
    ignore_index: int = -100,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``log_softmax(F.linear(input, linear_weight, linear_bias) /
    temperature).gather(target)`` per token, in ``target``'s shape (0 where
    ``target == ignore_index``), without the logits. float32 (float64 for
    float64 input) whatever the input's dtype: the label's logit as a
    float32 dot product minus the float32 logsumexp of
    ``fuseops.linear_cross_entropy_stats`` (a bfloat16 log-probability would
    carry 2^-9 of its value as rounding, about 0.02 nats a token, which
    sums over a sequence). Differentiable in ``input``, ``linear_weight`` and
    ``linear_bias`` (the gradient of the negated per-token losses of
    ``reduction="none"``; the backward recomputes the logits chunk by
    chunk)."""
    if not temperature > 0:
        raise ValueError(f"fuseops.preference: temperature must be > 0, got {temperature}")
    hidden = input.reshape(-1, input.shape[-1])
    targets = target.reshape(-1)
    if temperature != 1.0:
        # logits / T: the input (and the bias) scaled instead of the logits.
        hidden = hidden / temperature
        linear_bias = None if linear_bias is None else linear_bias / temperature
    loss, lse, _, _ = linear_cross_entropy_stats(
        hidden,
        linear_weight,
        targets,
        linear_bias,
        reduction="none",
        ignore_index=ignore_index,
    )
    logps = exact_log_probs(loss, lse, hidden, linear_weight, linear_bias, targets, ignore_index)
    return logps.reshape(target.shape)


def exact_log_probs(
    loss: torch.Tensor,
    lse: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    targets: torch.Tensor,
    ignore_index: Optional[int] = None,
    softcap: Optional[float] = None,
) -> torch.Tensor:
    """The per-row log-probabilities of the labels in ``lse``'s dtype, from
    the per-row losses and logsumexp of
    :func:`fuseops.linear_cross_entropy_stats` (``reduction="none"``): the
    value ``softcap(label logit) - lse`` (0 on ignored rows), the gradient
    that of ``-loss`` (the same derivative)."""
    counted = None if ignore_index is None else targets != ignore_index
    with torch.no_grad():
        labels = targets if counted is None else torch.where(counted, targets, 0)
        label_logit = _label_logits(hidden, weight, bias, labels, lse.dtype)
        if softcap is not None:
            label_logit = softcap * torch.tanh(label_logit / softcap)
        exact = label_logit - lse
        if counted is not None:
            exact = torch.where(counted, exact, 0)
    log_probs = -loss.to(lse.dtype)
    return log_probs + (exact - log_probs).detach()


def _label_logits(hidden, weight, bias, targets, dtype) -> torch.Tensor:
    """Each row's logit of its label, ``hidden . weight[label] + bias``,
    summed in ``dtype`` (the operands as autocast gives them to the
    product)."""
    if torch.is_autocast_enabled(hidden.device.type):
        dtype_now = torch.get_autocast_dtype(hidden.device.type)
        hidden, weight = hidden.to(dtype_now), weight.to(dtype_now)
        bias = None if bias is None else bias.to(dtype_now)
    rows = weight.index_select(0, targets).to(dtype)
    logit = (hidden.to(dtype) * rows).sum(-1)
    return logit if bias is None else logit + bias.index_select(0, targets).to(dtype)


def _split(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: Optional[torch.Tensor],
    ignore_index: int,
    name: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(chosen sums, rejected sums, chosen token counts, rejected token
    counts) of the per-token log-probabilities."""
    if target.dim() != 2 or target.shape[0] % 2:
        raise ValueError(
            f"fuseops.preference.{name}: target must be [2B, T] (B chosen sequences, then B "
            f"rejected), got shape {tuple(target.shape)}"
        )
    if input.shape[:-1] != target.shape and input.shape[0] != target.numel():
        raise ValueError(
            f"fuseops.preference.{name}: input must be [2B, T, H] or [2B * T, H] for target "
            f"{tuple(target.shape)}, got shape {tuple(input.shape)}"
        )
    logps = token_log_probs(input, linear_weight, target, linear_bias, ignore_index)
    sums = logps.float().sum(-1)
    counts = (target != ignore_index).sum(-1).to(sums.dtype)
    b = target.shape[0] // 2
    return sums[:b], sums[b:], counts[:b], counts[b:]


def _sigmoid_loss(logits: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    # cDPO's smoothing: the label flipped with probability label_smoothing.
    return -F.logsigmoid(logits) * (1 - label_smoothing) - F.logsigmoid(-logits) * label_smoothing


def fused_linear_dpo(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    ref_chosen_logps: Optional[torch.Tensor] = None,
    ref_rejected_logps: Optional[torch.Tensor] = None,
    *,
    linear_bias: Optional[torch.Tensor] = None,
    ref_input: Optional[torch.Tensor] = None,
    ref_weight: Optional[torch.Tensor] = None,
    ref_bias: Optional[torch.Tensor] = None,
    ignore_index: int = -100,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> PreferenceOutput:
    """Direct Preference Optimization (Rafailov et al., 2023) from the
    policy's hidden states and head: the sequences' summed log-probabilities
    ``logp`` (chosen ``c``, rejected ``r``) against the reference model's,
    given as ``ref_chosen_logps``/``ref_rejected_logps`` ``[B]`` or computed
    here without gradients from ``ref_input`` and ``ref_weight`` (the
    reference model's hidden states and head; ``ref_bias``). With ``Δ =
    (logp_c - ref_c) - (logp_r - ref_r)``:

    - ``"sigmoid"``: ``-logsigmoid(beta Δ)``, with ``label_smoothing`` ``ε``
      the conservative form ``-(1 - ε) logsigmoid(beta Δ) - ε
      logsigmoid(-beta Δ)`` (cDPO);
    - ``"hinge"``: ``relu(1 - beta Δ)`` (SLiC);
    - ``"ipo"``: ``(Δ' - 1 / (2 beta))^2`` with each log-ratio averaged over
      its completion's tokens (TRL's normalisation of IPO).

    The loss is the mean over the B pairs; rewards are ``beta * (logp -
    ref)``."""
    c, r, nc, nr = _split(
        input, linear_weight, target, linear_bias, ignore_index, "fused_linear_dpo"
    )
    if ref_chosen_logps is None or ref_rejected_logps is None:
        if ref_input is None or ref_weight is None:
            raise ValueError(
                "fuseops.preference.fused_linear_dpo: give ref_chosen_logps and "
                "ref_rejected_logps, or ref_input and ref_weight to compute them"
            )
        with torch.no_grad():
            ref_c, ref_r, _, _ = _split(
                ref_input, ref_weight, target, ref_bias, ignore_index, "fused_linear_dpo"
            )
    else:
        ref_c, ref_r = ref_chosen_logps.float(), ref_rejected_logps.float()
    chosen_ratio, rejected_ratio = c - ref_c, r - ref_r
    if loss_type == "sigmoid":
        losses = _sigmoid_loss(beta * (chosen_ratio - rejected_ratio), label_smoothing)
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * (chosen_ratio - rejected_ratio))
    elif loss_type == "ipo":
        delta = chosen_ratio / nc.clamp(min=1) - rejected_ratio / nr.clamp(min=1)
        losses = (delta - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(
            f"fuseops.preference.fused_linear_dpo: loss_type must be 'sigmoid', 'hinge' or "
            f"'ipo', got {loss_type!r}"
        )
    return PreferenceOutput(
        losses.mean(),
        (beta * chosen_ratio).detach(),
        (beta * rejected_ratio).detach(),
        c.detach(),
        r.detach(),
    )


def fused_linear_simpo(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    *,
    linear_bias: Optional[torch.Tensor] = None,
    ignore_index: int = -100,
    beta: float = 2.0,
    gamma: float = 0.5,
    label_smoothing: float = 0.0,
) -> PreferenceOutput:
    """SimPO (Meng et al., 2024): no reference model; the sequences'
    log-probabilities averaged over their completion tokens, ``-logsigmoid(
    beta (avg_c - avg_r) - gamma)`` (with cDPO's ``label_smoothing``), mean
    over the pairs; rewards ``beta * avg``. TRL's defaults (CPOConfig with
    ``loss_type="simpo"``: ``beta`` 2.0 there is the user's choice, gamma as
    ``simpo_gamma`` 0.5)."""
    c, r, nc, nr = _split(
        input, linear_weight, target, linear_bias, ignore_index, "fused_linear_simpo"
    )
    avg_c, avg_r = c / nc.clamp(min=1), r / nr.clamp(min=1)
    losses = _sigmoid_loss(beta * (avg_c - avg_r) - gamma, label_smoothing)
    return PreferenceOutput(
        losses.mean(),
        (beta * avg_c).detach(),
        (beta * avg_r).detach(),
        avg_c.detach(),
        avg_r.detach(),
    )


def _chosen_nll(c: torch.Tensor, nc: torch.Tensor) -> torch.Tensor:
    # The chosen sequences' cross-entropy: every chosen token counted once.
    return -c.sum() / nc.sum().clamp(min=1)


def fused_linear_cpo(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    *,
    linear_bias: Optional[torch.Tensor] = None,
    ignore_index: int = -100,
    beta: float = 0.1,
    alpha: float = 1.0,
    label_smoothing: float = 0.0,
    average_log_prob: bool = False,
) -> PreferenceOutput:
    """Contrastive Preference Optimization (Xu et al., 2024): no reference
    model; ``-logsigmoid(beta (logp_c - logp_r))`` (cDPO's
    ``label_smoothing``) plus ``alpha`` times the chosen sequences'
    cross-entropy per token (the behaviour-cloning term, TRL's
    ``cpo_alpha``); log-probabilities summed, or averaged per token with
    ``average_log_prob``; rewards ``beta * logp``."""
    c, r, nc, nr = _split(
        input, linear_weight, target, linear_bias, ignore_index, "fused_linear_cpo"
    )
    nll = _chosen_nll(c, nc)
    if average_log_prob:
        c, r = c / nc.clamp(min=1), r / nr.clamp(min=1)
    losses = _sigmoid_loss(beta * (c - r), label_smoothing)
    return PreferenceOutput(
        losses.mean() + alpha * nll,
        (beta * c).detach(),
        (beta * r).detach(),
        c.detach(),
        r.detach(),
        nll.detach(),
    )


def fused_linear_orpo(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    *,
    linear_bias: Optional[torch.Tensor] = None,
    ignore_index: int = -100,
    beta: float = 0.1,
) -> PreferenceOutput:
    """Odds Ratio Preference Optimization (Hong et al., 2024): the chosen
    sequences' cross-entropy per token minus ``beta`` times the mean of
    ``logsigmoid(log odds(c) - log odds(r))``, with the log-probabilities
    averaged per token and ``log odds(p) = log p - log(1 - p)`` (computed as
    ``logp - log1p(-exp(logp))``), TRL's ``ORPOTrainer`` form; rewards
    ``beta * avg``."""
    c, r, nc, nr = _split(
        input, linear_weight, target, linear_bias, ignore_index, "fused_linear_orpo"
    )
    nll = _chosen_nll(c, nc)
    avg_c, avg_r = c / nc.clamp(min=1), r / nr.clamp(min=1)
    log_odds = (avg_c - avg_r) - (torch.log1p(-torch.exp(avg_c)) - torch.log1p(-torch.exp(avg_r)))
    ratio = F.logsigmoid(log_odds)
    return PreferenceOutput(
        nll - beta * ratio.mean(),
        (beta * avg_c).detach(),
        (beta * avg_r).detach(),
        avg_c.detach(),
        avg_r.detach(),
        nll.detach(),
    )


class KTOOutput(NamedTuple):
    """What :func:`fused_linear_kto` returns: the loss (differentiable), the
    rewards ``beta * (logp - ref)`` of the desirable and of the undesirable
    examples, the sequences' summed log-probabilities ``[N]`` and the KL
    reference point used (all detached)."""

    loss: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor
    logps: torch.Tensor
    kl: torch.Tensor


def fused_linear_kto(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    desirable: torch.Tensor,
    ref_logps: Optional[torch.Tensor] = None,
    *,
    kl: Optional[torch.Tensor] = None,
    linear_bias: Optional[torch.Tensor] = None,
    ref_input: Optional[torch.Tensor] = None,
    ref_weight: Optional[torch.Tensor] = None,
    ref_bias: Optional[torch.Tensor] = None,
    ignore_index: int = -100,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    loss_type: str = "kto",
) -> KTOOutput:
    """Kahneman-Tversky Optimization (Ethayarajh et al., 2024) in TRL's
    ``KTOTrainer`` form, for unpaired examples: ``input`` ``[N, T, H]``,
    ``target`` ``[N, T]``, ``desirable`` ``[N]`` bool (True: a desirable
    completion). With ``r = logp - ref`` per sequence (``ref_logps`` ``[N]``,
    or computed without gradients from ``ref_input``/``ref_weight``) and the
    reference point ``kl`` (TRL: the clamped mean of the policy's minus the
    reference's log-probabilities of mismatched prompt/completion pairs,
    detached; default 0), ``"kto"``: desirable ``1 - sigmoid(beta (r -
    kl))``, undesirable ``1 - sigmoid(beta (kl - r))``;
    ``"apo_zero_unpaired"``: ``1 - sigmoid(beta r)`` and ``sigmoid(beta
    r)``; weighted by ``desirable_weight``/``undesirable_weight``, mean over
    the N examples."""
    if loss_type not in ("kto", "apo_zero_unpaired"):
        raise ValueError(
            "fuseops.preference.fused_linear_kto: loss_type must be 'kto' or "
            f"'apo_zero_unpaired', got {loss_type!r}"
        )
    if target.dim() != 2 or desirable.shape != target.shape[:1]:
        raise ValueError(
            "fuseops.preference.fused_linear_kto: target must be [N, T] and desirable [N], got "
            f"{tuple(target.shape)} and {tuple(desirable.shape)}"
        )
    logps = token_log_probs(input, linear_weight, target, linear_bias, ignore_index).float().sum(-1)
    if ref_logps is None:
        if ref_input is None or ref_weight is None:
            raise ValueError(
                "fuseops.preference.fused_linear_kto: give ref_logps, or ref_input and ref_weight "
                "to compute them"
            )
        with torch.no_grad():
            ref = token_log_probs(ref_input, ref_weight, target, ref_bias, ignore_index)
            ref_logps = ref.float().sum(-1)
    ratio = logps - ref_logps.float()
    point = torch.zeros((), device=logps.device) if kl is None else kl.detach().float()
    if loss_type == "kto":
        good = 1 - torch.sigmoid(beta * (ratio - point))
        bad = 1 - torch.sigmoid(beta * (point - ratio))
    else:
        good = 1 - torch.sigmoid(beta * ratio)
        bad = torch.sigmoid(beta * ratio)
    desirable = desirable.to(torch.bool)
    losses = torch.where(desirable, desirable_weight * good, undesirable_weight * bad)
    rewards = (beta * ratio).detach()
    return KTOOutput(losses.mean(), rewards[desirable], rewards[~desirable], logps.detach(), point)


class GRPOOutput(NamedTuple):
    """What :func:`fused_linear_grpo` returns: the loss (differentiable), the
    per-token log-probabilities ``[B, T]`` (detached; what the next
    iteration passes as ``old_logps``), the mean per-token KL to the
    reference over the completion tokens (0 without a reference) and the
    fraction of completion tokens whose ratio was clipped (both detached)."""

    loss: torch.Tensor
    token_logps: torch.Tensor
    kl: torch.Tensor
    clip_fraction: torch.Tensor


def fused_linear_grpo(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    advantages: torch.Tensor,
    old_logps: Optional[torch.Tensor] = None,
    ref_logps: Optional[torch.Tensor] = None,
    *,
    linear_bias: Optional[torch.Tensor] = None,
    ignore_index: int = -100,
    beta: float = 0.0,
    epsilon_low: float = 0.2,
    epsilon_high: Optional[float] = None,
    loss_type: str = "dapo",
    importance_sampling_level: str = "token",
    num_items_in_batch: Optional[float] = None,
    max_completion_length: Optional[int] = None,
    temperature: float = 1.0,
    use_bias_correction_kl: bool = True,
) -> GRPOOutput:
    """Group Relative Policy Optimization (Shao et al., 2024) in TRL's
    ``GRPOTrainer`` form, from the policy's hidden states and head:
    ``input`` ``[B, T, H]``, ``target`` ``[B, T]`` (the completions' tokens,
    shifted, ``ignore_index`` elsewhere), ``advantages`` ``[B]``.
    With ``logp`` the per-token log-probabilities (at ``temperature``),
    ``old_logps`` those of the sampling policy (default: ``logp`` detached,
    ratio 1), the importance weight ``w = exp(logp - old)`` per token
    (``importance_sampling_level="sequence"``: exp of the mean log-ratio of
    the sequence, GSPO), the per-token loss is ``-min(w A, clip(w, 1 -
    epsilon_low, 1 + epsilon_high) A)`` plus, with ``beta`` and
    ``ref_logps`` ``[B, T]``, ``beta * (exp(ref - logp) - (ref - logp) -
    1)`` (the k3 estimate of KL), times ``w`` with
    ``use_bias_correction_kl`` (TRL's default since 1.x: the ratio is
    differentiable, so it changes the KL's gradient even where ``w`` is 1;
    ``kl`` is then the corrected term's mean, as TRL logs it). Aggregation
    by ``loss_type``: ``"dapo"``
    (TRL's default) the sum over completion tokens divided by
    ``num_items_in_batch`` (default: their count); ``"bnpo"`` the mean over
    completion tokens; ``"grpo"`` each sequence's mean, then the mean over
    sequences; ``"dr_grpo"`` the sum divided by ``B * max_completion_length``
    (default ``T``)."""
    if loss_type not in ("dapo", "bnpo", "grpo", "dr_grpo"):
        raise ValueError(
            "fuseops.preference.fused_linear_grpo: loss_type must be 'dapo', 'bnpo', 'grpo' or "
            f"'dr_grpo', got {loss_type!r}"
        )
    if importance_sampling_level not in ("token", "sequence"):
        raise ValueError(
            "fuseops.preference.fused_linear_grpo: importance_sampling_level must be 'token' or "
            f"'sequence', got {importance_sampling_level!r}"
        )
    if target.dim() != 2 or advantages.shape != target.shape[:1]:
        raise ValueError(
            "fuseops.preference.fused_linear_grpo: target must be [B, T] and advantages [B], got "
            f"{tuple(target.shape)} and {tuple(advantages.shape)}"
        )
    if beta != 0.0 and ref_logps is None:
        raise ValueError("fuseops.preference.fused_linear_grpo: beta != 0 needs ref_logps")
    logps = token_log_probs(
        input, linear_weight, target, linear_bias, ignore_index, temperature
    ).float()
    mask = (target != ignore_index).to(logps.dtype)
    old = logps.detach() if old_logps is None else old_logps.float()
    log_ratio = logps - old
    if importance_sampling_level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1)
    ratio = torch.exp(log_ratio)
    high = epsilon_low if epsilon_high is None else epsilon_high
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + high)
    a = advantages.float().unsqueeze(-1)
    per_token = -torch.min(ratio * a, clipped * a)
    kl = torch.zeros((), device=logps.device)
    if beta != 0.0:
        assert ref_logps is not None
        delta = ref_logps.float() - logps
        per_token_kl = torch.exp(delta) - delta - 1
        if use_bias_correction_kl:
            per_token_kl = per_token_kl * ratio
        per_token = per_token + beta * per_token_kl
        kl = ((per_token_kl * mask).sum() / mask.sum().clamp(min=1)).detach()
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    elif loss_type == "bnpo":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1)
    elif loss_type == "dr_grpo":
        length = target.shape[1] if max_completion_length is None else max_completion_length
        loss = (per_token * mask).sum() / (target.shape[0] * length)
    else:
        items = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        loss = (per_token * mask).sum() / items
    was_clipped = ((ratio != clipped) & (mask > 0)).to(logps.dtype)
    clip_fraction = (was_clipped.sum() / mask.sum().clamp(min=1)).detach()
    return GRPOOutput(loss, logps.detach(), kl, clip_fraction)


__all__ = [
    "GRPOOutput",
    "KTOOutput",
    "PreferenceOutput",
    "fused_linear_cpo",
    "fused_linear_dpo",
    "fused_linear_grpo",
    "fused_linear_kto",
    "fused_linear_orpo",
    "fused_linear_simpo",
    "exact_log_probs",
    "token_log_probs",
]


# --- bench: python -m fuseops bench --ops preference_dpo,preference_grpo
# (collected by fuseops.bench.cases beside the op modules' cases) ---

#: The bench's sequence length: rows (tokens) = sequences x this, when rows
#: allow (fewer rows: one sequence pair).
_BENCH_SEQUENCE = 512
_BENCH_BETA = 0.1


def _bench_tokens(rows: int, sequences_per_group: int) -> tuple[int, int]:
    # (sequences, length): sequences a multiple of the group size (a
    # chosen/rejected pair: 2), sequences * length the rows (rounded down
    # where they do not split).
    sequences = max(sequences_per_group, rows // _BENCH_SEQUENCE)
    sequences -= sequences % sequences_per_group
    return sequences, max(1, rows // sequences)


def _bench_targets(rows, vocab, sequences_per_group, device, gen):
    sequences, length = _bench_tokens(rows, sequences_per_group)
    target = torch.randint(0, vocab, (sequences, length), device=device, generator=gen)
    # A prompt (ignored) of a quarter of each sequence and 0-15 padding
    # positions at its end, as a trainer's labels have them.
    target[:, : length // 4] = -100
    padding = torch.randint(0, 16, (sequences,), device=device, generator=gen)
    positions = torch.arange(length, device=device)
    target[positions >= length - padding[:, None].clamp(max=length // 2)] = -100
    return target


def _bench_head(target, vocab, dtype, device, gen):
    from .ops.cases.cross_entropy import _linear_inputs

    x, w, _ = _linear_inputs(target.numel(), vocab, dtype, device, gen)
    return x, w


def _bench_dpo_inputs(rows, vocab, dtype, device, gen):
    # Chosen then rejected sequences; the reference model's log-probabilities
    # the policy's own within a few nats, so that beta * delta is O(1) and
    # the loss's gradient is not saturated.
    target = _bench_targets(rows, vocab, 2, device, gen)
    x, w = _bench_head(target, vocab, dtype, device, gen)
    with torch.no_grad():
        sums = token_log_probs(x, w, target).float().sum(-1)
    sums += 3 * torch.randn(sums.shape, device=device, generator=gen)
    b = target.shape[0] // 2
    return x, w, target, sums[:b].clone(), sums[b:].clone()


def _bench_grpo_inputs(rows, vocab, dtype, device, gen):
    target = _bench_targets(rows, vocab, 1, device, gen)
    x, w = _bench_head(target, vocab, dtype, device, gen)
    advantages = torch.randn(target.shape[0], device=device, generator=gen)
    return x, w, target, advantages


def _eager_token_log_probs(x, w, target):
    # What a training loop writes: the logits materialised, log_softmax in
    # float32 (float64 for the float64 reference), the labels gathered.
    target = target.long()
    logits = F.linear(x, w)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    mask = target != -100
    logps = torch.log_softmax(logits, -1).gather(-1, target.clamp(min=0).reshape(-1, 1))
    return logps.reshape(target.shape) * mask, mask


def _bench_dpo(x, w, target, ref_chosen, ref_rejected):
    return fused_linear_dpo(x, w, target.long(), ref_chosen, ref_rejected, beta=_BENCH_BETA).loss


def _eager_dpo(x, w, target, ref_chosen, ref_rejected):
    logps, _ = _eager_token_log_probs(x, w, target)
    sums = logps.sum(-1)
    b = sums.shape[0] // 2
    delta = (sums[:b] - ref_chosen) - (sums[b:] - ref_rejected)
    return -F.logsigmoid(_BENCH_BETA * delta).mean()


def _bench_grpo(x, w, target, advantages):
    return fused_linear_grpo(x, w, target.long(), advantages).loss


def _eager_grpo(x, w, target, advantages):
    # TRL's default: token-level ratio against the sampling policy (here the
    # policy itself: ratio 1), clipped at 0.2, summed over the completion
    # tokens and divided by their count (loss_type "dapo").
    logps, mask = _eager_token_log_probs(x, w, target)
    ratio = torch.exp(logps - logps.detach())
    a = advantages.unsqueeze(-1)
    per_token = -torch.min(ratio * a, torch.clamp(ratio, 0.8, 1.2) * a)
    return (per_token * mask).sum() / mask.sum()


def bench_cases():
    """DPO (chosen and rejected sequences, the reference log-probabilities
    given) and GRPO (TRL's defaults) from hidden states and an LM head,
    against the same losses on materialised logits."""
    from .ops.cases._bench_case import Case, Traffic

    return [
        Case(
            name,
            fuseops_fn,
            eager_fn,
            make_inputs,
            forward_traffic=Traffic(rows=0, vectors=2048),
            backward_traffic=Traffic(rows=0, vectors=2 * 2048),
            has_out=False,
            differentiable=(0, 1),
            variant=True,
            description=f"{label} of x [rows, min(2048, V)] @ W.T, V = hidden, sequences of "
            f"{_BENCH_SEQUENCE} tokens (a quarter of them prompt), the loss only",
        )
        for name, fuseops_fn, eager_fn, make_inputs, label in (
            (
                "preference_dpo",
                _bench_dpo,
                _eager_dpo,
                _bench_dpo_inputs,
                "fused_linear_dpo (sigmoid, beta 0.1, chosen + rejected)",
            ),
            (
                "preference_grpo",
                _bench_grpo,
                _eager_grpo,
                _bench_grpo_inputs,
                "fused_linear_grpo (TRL's defaults: dapo, token-level ratio, clip 0.2)",
            ),
        )
    ]
