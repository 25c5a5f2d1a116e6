"""Random calls of an op for the property-based fuzzer (tests_py/test_fuzz.py).

An op module declares ``fuzz(d) -> Sample``: one random valid call of its
ops, drawn through ``d`` (a :class:`Draw`), whose reference is
``fuseops.reference.<sample.name>`` as for the conformance samples. The
fuzzer derives everything else from it: the values (normal, subnormal, or
laced with NaN, Inf and the dtype's largest values), the invalid arguments
(each tensor made None, of another rank, size, dtype or device; strings and
numbers replaced by bad ones) and the checks. ``d`` draws from integers only,
so that the fuzzing library (the tests' dependency, not fuseops') shrinks a
failing call to a small one; tensor values come from a seeded generator.
"""

from __future__ import annotations

import builtins
from typing import Callable, Optional, Sequence

import torch

from ._sample import DTYPES

#: Value regimes of one call's tensors: standard normal times the declared
#: scale, mostly subnormal (the dtype's smallest normal / 4 times standard
#: normal), or normal with a few elements replaced by NaN, +-Inf or +-the
#: dtype's largest finite value.
REGIMES = ("normal", "normal", "normal", "tiny", "special")


class Draw:
    """Draws the parts of one random call from ``integer(lo, hi)`` (a
    uniform-ish integer in [lo, hi])."""

    def __init__(
        self, integer: Callable[[int, int], int], device="cpu", regime: Optional[str] = None
    ):
        self._integer = integer
        self.device = device
        self.regime = regime if regime is not None else self.choice(REGIMES)
        #: A declaration sets float32 where its op computes float64 inputs
        #: in float32 (as documented); float64 results then get float32's
        #: tolerance.
        self.math_dtype = None

    def int(self, lo: builtins.int, hi: builtins.int) -> builtins.int:
        return self._integer(lo, hi)

    def choice(self, options: Sequence):
        return options[self.int(0, len(options) - 1)]

    def flag(self) -> bool:
        return bool(self.int(0, 1))

    def size(self, hi: builtins.int = 9) -> builtins.int:
        """A dimension's size: 0 and 1 as often as any larger size."""
        return self.choice((0, 1, self.int(2, hi)) if hi >= 2 else (0, 1))

    def shape(
        self, min_dims: builtins.int = 0, max_dims: builtins.int = 3, hi: builtins.int = 9
    ) -> tuple:
        return tuple(self.size(hi) for _ in range(self.int(min_dims, max_dims)))

    def dtype(self) -> torch.dtype:
        return self.choice(DTYPES)

    def maybe(self, make: Callable):
        """``make()`` or None."""
        return make() if self.flag() else None

    def tensor(
        self, shape, dtype=None, scale: float = 1.0, grad: bool = False, writable: bool = False
    ) -> torch.Tensor:
        """A tensor of `shape` and `dtype` (drawn when None) in a random
        layout: contiguous, permuted, sliced with a step, or expanded (stride
        0) along a dimension; values in this call's regime. With `grad`, a
        leaf that requires grad (the fuzzer sets it only where it checks
        gradients). `writable` (an op writes into it): never expanded."""
        shape = tuple(shape)
        dtype = dtype or self.dtype()
        gen = torch.Generator().manual_seed(self.int(0, 2**31 - 1))
        layouts = ("contiguous", "permuted", "sliced") + (() if writable else ("expanded",))
        layout = self.choice(layouts) if shape else "contiguous"
        dim = self.int(0, len(shape) - 1) if shape else 0
        base_shape = list(shape)
        if layout == "expanded":
            base_shape[dim] = 1
        if layout == "sliced":
            base_shape[dim] = 2 * shape[dim] + 1
        values = self._values(base_shape, dtype, scale, gen)
        if layout == "permuted":
            order = list(range(len(shape)))
            order.insert(0, order.pop(dim))  # `dim` outermost in memory
            values = (
                values.permute(order)
                .contiguous()
                .permute(sorted(range(len(shape)), key=order.__getitem__))
            )
        elif layout == "sliced":
            values = values.narrow(dim, 1, 2 * shape[dim])[
                (slice(None),) * dim + (slice(None, None, 2),)
            ]
        elif layout == "expanded":
            values = values.expand(shape)
        assert tuple(values.shape) == shape, (values.shape, shape, layout)
        return values.to(self.device).detach().requires_grad_(grad)

    def integers(
        self, shape, lo: builtins.int, hi: builtins.int, dtype=torch.int64
    ) -> torch.Tensor:
        """Integers in [lo, hi) of `shape` (indices, positions)."""
        gen = torch.Generator().manual_seed(self.int(0, 2**31 - 1))
        return torch.randint(lo, max(hi, lo + 1), tuple(shape), generator=gen, dtype=dtype).to(
            self.device
        )

    def _values(self, shape, dtype, scale, gen) -> torch.Tensor:
        info = torch.finfo(dtype)
        x = torch.randn(shape, generator=gen, dtype=torch.float64)
        if self.regime == "tiny":
            x = x * (info.tiny / 4)
        else:
            x = x * scale
        if self.regime == "special" and x.numel():
            specials = torch.tensor(
                [float("nan"), float("inf"), -float("inf"), info.max, -info.max],
                dtype=torch.float64,
            )
            for _ in range(self.int(1, 3)):
                x.view(-1)[self.int(0, x.numel() - 1)] = specials[self.int(0, len(specials) - 1)]
        return x.to(dtype)
