"""Formatting a tensor like torch does: one line of metadata, then the
values nested like torch.Tensor.__repr__, elided beyond a limit."""

from __future__ import annotations

import itertools
import math
import struct

import gdb

from ._layout import Invalid, LayoutError
from .decode import DType
from .reader import TensorInfo, read_elements, read_tensor


def _plan(sizes: list[int], limit: int | None) -> list[list[int | None]]:
    """Per dimension, the indices shown (None marks the elided middle)."""
    total = math.prod(sizes)
    if limit is None or total <= limit:
        return [list(range(size)) for size in sizes]

    def shown(edge: int) -> int:
        return math.prod(min(size, 2 * edge) for size in sizes)

    edge = 1
    while shown(edge + 1) <= limit and edge < max(sizes):
        edge += 1
    counts = [min(size, 2 * edge) for size in sizes]
    # Too many dimensions for even one element from each end: show only the
    # first sub-tensor of the outer dimensions.
    for dim in range(len(sizes)):
        if math.prod(counts) <= limit:
            break
        counts[dim] = 1
    plan = []
    for size, count in zip(sizes, counts):
        if count >= size:
            plan.append(list(range(size)))
        elif count == 1:
            plan.append([0, None])
        else:
            half = count // 2
            plan.append(list(range(half)) + [None] + list(range(size - half, size)))
    return plan


def _float_formatter(values: list[float]):
    finite = [v for v in values if math.isfinite(v)]
    magnitudes = [abs(v) for v in finite if v != 0]
    integral = all(v == math.floor(v) for v in finite)
    scientific = bool(magnitudes) and (
        max(magnitudes) > 1e8
        or (not integral and (max(magnitudes) / min(magnitudes) > 1000 or min(magnitudes) < 1e-4))
    )

    def fmt(v: float) -> str:
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if scientific:
            return f"{v:.4e}"
        if integral:
            return f"{v:.0f}."
        return f"{v:.4f}"

    return fmt


def _formatter(dtype: DType, values: list):
    if dtype.enumerator == "Bool":
        return lambda v: "True" if v else "False"
    if dtype.is_complex:
        real = _float_formatter([v.real for v in values])
        imag = _float_formatter([abs(v.imag) for v in values])

        def fmt_complex(v: complex) -> str:
            sign = "-" if v.imag < 0 or (v.imag == 0 and math.copysign(1, v.imag) < 0) else "+"
            return f"{real(v.real)}{sign}{imag(abs(v.imag))}j"

        return fmt_complex
    if isinstance(values[0], float):
        return _float_formatter(values)
    return str


def format_values(info: TensorInfo, limit: int | None) -> str:
    """The nested values, like torch's repr without "tensor(" and options.

    Raises gdb.MemoryError when the data cannot be read.
    """
    sizes = info.sizes
    if info.numel == 0:
        return "[]"
    plan = _plan(sizes, limit)
    shown = list(itertools.product(*[[i for i in dim if i is not None] for dim in plan]))
    values = read_elements(info, shown)
    fmt = _formatter(info.dtype, list(values.values()))
    text = {index: fmt(v) for index, v in values.items()}
    width = max(len(t) for t in text.values())
    ndim = len(sizes)

    def build(dim: int, prefix: tuple) -> str:
        if dim == ndim:
            return text[prefix].rjust(width)
        parts = ["..." if i is None else build(dim + 1, prefix + (i,)) for i in plan[dim]]
        if dim == ndim - 1:
            return "[" + ", ".join(parts) + "]"
        return "[" + ("," + "\n" * (ndim - dim - 1) + " " * (dim + 1)).join(parts) + "]"

    return build(0, ())


def format_shape(values: list) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def describe(info: TensorInfo) -> str:
    """One line: dtype, shape, device and what differs from the defaults."""
    words = [info.dtype.name, format_shape(info.sizes), info.device]
    contiguous = info.is_contiguous()
    if not contiguous:
        words.append("strides=" + format_shape(info.strides))
    if str(info.storage_offset) != "0":
        words.append(f"storage_offset={info.storage_offset}")
    if info.requires_grad is None:
        words.append("requires_grad=?")
    elif info.requires_grad:
        words.append("requires_grad=True")
    if info.grad is not None:
        grad = info.grad
        words.append("grad=<" + safe("grad", lambda: describe(read_tensor(grad))) + ">")
    return " ".join(words)


def format_tensor(kind: str, info: TensorInfo, limit: int | None, with_values: bool = True) -> str:
    if info.undefined:
        return f"{kind} undefined"
    head = f"{kind} {describe(info)}"
    if not with_values:
        return head
    if info.no_values is not None:
        return f"{head} <no values: {info.no_values}>"
    try:
        values = format_values(info, limit)
    except gdb.MemoryError as error:
        return f"{head} <no values: {_memory_error(error)}>"
    except Invalid as error:
        return f"{head} <no values: {error}>"
    if "\n" in values:
        return f"{head}\n{values}"
    return f"{head} = {values}"


def _memory_error(error: Exception) -> str:
    text = str(error)
    return text[0].lower() + text[1:] if text else "cannot read memory"


def safe(kind: str, action) -> str:
    """Runs action(); garbage and missing layouts become one short line."""
    try:
        return action()
    except Invalid as error:
        return f"<invalid {kind}: {error}>"
    except gdb.MemoryError as error:
        return f"<invalid {kind}: {_memory_error(error)}>"
    except LayoutError as error:
        return f"<{kind}: {error}>"
    except (gdb.error, OverflowError, ValueError, struct.error) as error:
        return f"<invalid {kind}: {error}>"
