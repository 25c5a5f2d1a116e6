"""fuseops.nn modules of the preference and RL losses fused with the LM head
(``fuseops.preference``): each holds a loss's options and calls its
function in ``forward``, the form Liger-Kernel's ``LigerFusedLinearDPOLoss``
and its siblings have. They replace no ``torch.nn`` module (torch has none
of these losses)."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from .. import preference


class _FusedLinearPreferenceLoss(torch.nn.Module):
    """A preference loss with its options fixed at construction: any
    keyword-only option of the loss's function (its defaults otherwise);
    ``forward`` takes the function's positional tensors (and any keyword it
    accepts) and returns what the function returns."""

    _function: Callable[..., Any]

    def __init__(self, **options: Any) -> None:
        super().__init__()
        parameters = inspect.signature(type(self)._function).parameters
        allowed = {n for n, p in parameters.items() if p.kind == inspect.Parameter.KEYWORD_ONLY}
        tensors = {"linear_bias", "ref_input", "ref_weight", "ref_bias", "kl"}
        unknown = sorted(set(options) - (allowed - tensors))
        if unknown:
            raise TypeError(
                f"fuseops.nn.{type(self).__name__}: unknown option(s) {', '.join(unknown)}; "
                f"options: {', '.join(sorted(allowed - tensors))}"
            )
        self.options = options

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return type(self)._function(*args, **{**self.options, **kwargs})

    def extra_repr(self) -> str:
        return ", ".join(f"{name}={value!r}" for name, value in self.options.items())


class FusedLinearDPOLoss(_FusedLinearPreferenceLoss):
    """:func:`fuseops.preference.fused_linear_dpo`: options ``beta``,
    ``loss_type``, ``label_smoothing``, ``ignore_index``; ``forward(input,
    linear_weight, target, ref_chosen_logps=None, ref_rejected_logps=None,
    *, linear_bias=None, ref_input=None, ref_weight=None, ref_bias=None)``."""

    _function = staticmethod(preference.fused_linear_dpo)


class FusedLinearSimPOLoss(_FusedLinearPreferenceLoss):
    """:func:`fuseops.preference.fused_linear_simpo`: options ``beta``,
    ``gamma``, ``label_smoothing``, ``ignore_index``; ``forward(input,
    linear_weight, target, *, linear_bias=None)``."""

    _function = staticmethod(preference.fused_linear_simpo)


class FusedLinearCPOLoss(_FusedLinearPreferenceLoss):
    """:func:`fuseops.preference.fused_linear_cpo`: options ``beta``,
    ``alpha``, ``label_smoothing``, ``average_log_prob``, ``ignore_index``;
    ``forward(input, linear_weight, target, *, linear_bias=None)``."""

    _function = staticmethod(preference.fused_linear_cpo)


class FusedLinearORPOLoss(_FusedLinearPreferenceLoss):
    """:func:`fuseops.preference.fused_linear_orpo`: options ``beta``,
    ``ignore_index``; ``forward(input, linear_weight, target, *,
    linear_bias=None)``."""

    _function = staticmethod(preference.fused_linear_orpo)


class FusedLinearKTOLoss(_FusedLinearPreferenceLoss):
    """:func:`fuseops.preference.fused_linear_kto`: options ``beta``,
    ``desirable_weight``, ``undesirable_weight``, ``loss_type``,
    ``ignore_index``; ``forward(input, linear_weight, target, desirable,
    ref_logps=None, *, kl=None, linear_bias=None, ref_input=None,
    ref_weight=None, ref_bias=None)``."""

    _function = staticmethod(preference.fused_linear_kto)


class FusedLinearGRPOLoss(_FusedLinearPreferenceLoss):
    """:func:`fuseops.preference.fused_linear_grpo`: options ``beta``,
    ``epsilon_low``, ``epsilon_high``, ``loss_type``,
    ``importance_sampling_level``, ``num_items_in_batch``,
    ``max_completion_length``, ``temperature``, ``use_bias_correction_kl``,
    ``ignore_index``; ``forward(input, linear_weight, target, advantages,
    old_logps=None, ref_logps=None, *, linear_bias=None)``."""

    _function = staticmethod(preference.fused_linear_grpo)
