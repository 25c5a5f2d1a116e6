"""What an op module's ``row_reduction_cases()`` returns: calls of the op
whose loss or gradients sum over many rows (a weight's gradient, a mean
loss), at sizes where every thread gets several blocks of rows. They sit
beside their ops; tests_py/test_threads.py checks that each gives the same
bits with 1, 2 and 3 threads (the sums over rows are split by the rows
alone, never by the thread count) and run to run."""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch


class RowReductionCase(NamedTuple):
    name: str
    #: Makes the op's result (a tensor) from ``leaves``.
    call: Callable[[], torch.Tensor]
    #: The tensors whose gradients are compared.
    leaves: tuple


def leaves(*shapes: tuple, seed: int = 0) -> list[torch.Tensor]:
    """Normal float32 tensors that require grad, the same on every call."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).requires_grad_() for shape in shapes]
