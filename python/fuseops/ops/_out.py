"""Calling an op in its functional form or in its ``out=`` form, the choice
every wrapper with preallocated outputs makes. Imports nothing beyond torch.
"""

from __future__ import annotations

from typing import Any, Optional

import torch


def call(op, *args: Any, out: Optional[torch.Tensor] = None, overload: str = "default") -> Any:
    """``op.<overload>(*args)``, or, with ``out`` given, the same overload's
    ``out=`` form (the schemas name it ``out`` for the default overload and
    ``<overload>_out`` for another), returning ``out``."""
    default = overload == "default"
    if out is None:
        return op(*args) if default else getattr(op, overload)(*args)
    getattr(op, "out" if default else f"{overload}_out")(*args, out=out)
    return out


def call_with_outs(name: str, args: tuple, **outs: Optional[torch.Tensor]) -> Any:
    """``torch.ops.fuseops.<name>(*args)``, or, with the preallocated outputs
    ``outs`` (keyword arguments of the op's ``out`` overload; all of them or
    none, else a TypeError naming ``fuseops.<name>``), that overload,
    returning them as a tuple."""
    op = getattr(torch.ops.fuseops, name)
    given = [value is not None for value in outs.values()]
    if not any(given):
        return op(*args)
    if not all(given):
        keywords = [f"{keyword}=" for keyword in outs]
        listed = ", ".join(keywords[:-1]) + " and " + keywords[-1]
        raise TypeError(f"fuseops.{name}: {listed} go together")
    op.out(*args, **outs)
    return tuple(outs.values())


__all__ = ["call", "call_with_outs"]
