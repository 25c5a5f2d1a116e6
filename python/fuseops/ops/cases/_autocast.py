"""What the op modules' autocast parity cases share (their
``autocast_cases()``, run by tests_py/test_autocast.py): the case type, the
autocast dtype and the input makers.

Each case calls a fuseops op and the torch composition it stands for on the
same inputs under ``torch.autocast("cpu", dtype=torch.bfloat16)``: the
dtypes must be the ones torch's own ops give there, the values within
bfloat16 rounding. An op whose module registers an autocast kernel
(``FUSEOPS_AUTOCAST`` in its ``cpp/ops/<op>.cpp``) has at least one case;
ops that fall through may have some too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

#: The autocast dtype of the cases.
LOW = torch.bfloat16
#: The feature size of their inputs.
D = 16


@dataclass(frozen=True)
class AutocastCase:
    """``ours(*args)`` against ``theirs(*args)`` under CPU autocast for each
    argument tuple of ``inputs``. ``name`` is the fuseops op the case is
    about (its autocast kernel, if it has one, is what runs)."""

    name: str
    ours: Callable
    theirs: Callable
    inputs: Sequence[tuple]


def rand(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal values in ``dtype`` (drawn in float32)."""
    return torch.randn(*shape).to(dtype)


def weight(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A norm's weight of ``D`` values in [0.5, 1.5)."""
    return (torch.rand(D) + 0.5).to(dtype)
