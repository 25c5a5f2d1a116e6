"""Sample calls of an op's dispatcher overloads, and inputs in the layouts
they cover, for the conformance suite (tests_py/test_conformance.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

#: The dtypes every op takes.
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Sample:
    """One call ``op(*args, **kwargs)`` of one overload of a fuseops op.

    ``kwargs`` holds only the ``out=`` tensors of an out overload.
    ``wrapper`` is the public function that makes this call when given
    ``wrapper_args`` (``args`` when None) and the same ``kwargs``. Tensors
    that require grad are leaves, so that a sample can be copied and saved.
    ``large`` samples (several tasks per thread, a vector tail in every row)
    are only run in every CPU build, not put through opcheck or compilers.
    """

    op: torch._ops.OpOverload
    args: tuple
    wrapper: Callable
    kwargs: dict = field(default_factory=dict)
    wrapper_args: Optional[tuple] = None
    large: bool = False

    @property
    def name(self) -> str:
        """The op's name without namespace, e.g. ``rms_norm_backward``."""
        return self.op._schema.name.split("::", 1)[1]

    @property
    def overload(self) -> str:
        return self.op._overloadname

    @property
    def public_args(self) -> tuple:
        return self.args if self.wrapper_args is None else self.wrapper_args

    def __repr__(self) -> str:
        def describe(a):
            if isinstance(a, torch.Tensor):
                layout = "" if a.is_contiguous() else f" strides {tuple(a.stride())}"
                grad = " grad" if a.requires_grad else ""
                return f"{str(a.dtype)[6:]}{list(a.shape)}{layout}{grad}"
            return repr(a)

        inner = ", ".join(describe(a) for a in self.args)
        inner += "".join(f", {k}={describe(v)}" for k, v in self.kwargs.items())
        return f"{self.op}({inner})"


def tensor(shape, dtype=torch.float32, device="cpu", layout="contiguous", grad=False, scale=1.0):
    """A random tensor (standard normal times `scale`) of `shape` in
    `layout`: "contiguous", "transposed" (first and last dimensions swapped in
    memory), "sliced" (every other element of a wider last dimension) or
    "expanded" (stride 0 along the first dimension); 0-d tensors are always
    contiguous. With `grad`, a leaf that requires grad."""
    shape = tuple(shape)

    def randn(base_shape):
        return (torch.randn(base_shape, dtype=torch.float64, device=device) * scale).to(dtype)

    if layout == "contiguous" or not shape:
        t = randn(shape)
    elif layout == "transposed" and len(shape) > 1:
        t = randn(shape[-1:] + shape[1:-1] + shape[:1]).transpose(0, -1)
    elif layout == "sliced":
        t = randn(shape[:-1] + (2 * shape[-1] + 1,))[..., 1::2]
    elif layout == "expanded":
        t = randn((1,) + shape[1:]).expand(shape)
    else:
        raise ValueError(f"unknown layout {layout!r} for shape {shape}")
    return t.detach().requires_grad_(grad)
