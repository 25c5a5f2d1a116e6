"""The fuseops ops, one module per op family, found without a list.

Each public module here (a name without a leading underscore) holds, for its
ops: the public wrappers over ``torch.ops.fuseops`` (named in its
``__all__``; ``fuseops`` imports them by name), the plain-PyTorch references
(the module's functions named ``<op>_reference``; ``fuseops.reference``
imports them as ``<op>``; both import lists are written by
``tools/generate_exports.py``), its export forms: ``onnx_translations()`` and
``executorch_decompositions()`` (collected by ``fuseops.onnx`` and
``fuseops.executorch``), or ``NOT_EXPORTED`` (why an op has none), described
in ``_export.py``; and ``BACKWARD_OPS`` where an op's gradients are not
computed by ``<op>_backward`` (:func:`backward_op`). The calls that test and
measure its ops (samples, fuzz cases, bench rows, export cases) live in
``fuseops.ops.cases.<op>``, out of ``import fuseops``'s way. A new op is a
new module, its cases module, and a run of ``tools/generate_exports.py``.

Every ``out=`` may share memory with the inputs (the result is that of the
inputs before the call); an ``out=`` whose elements overlap each other, two
outputs sharing memory, or an ``out=`` that must be resized while sharing an
input's memory are refused (python/README.md, "`out=` and memory shared with inputs").
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Optional


def _discover() -> tuple[ModuleType, ...]:
    # Sorted by name, so that everything collected from the modules (exports,
    # bench rows, samples) comes in the same order on every machine.
    names = sorted(
        info.name
        for info in pkgutil.iter_modules(__path__)
        if not info.name.startswith("_") and not info.ispkg
    )
    return tuple(importlib.import_module(f"{__name__}.{name}") for name in names)


#: The op modules, sorted by name.
MODULES = _discover()


def backward_op(forward: str) -> Optional[str]:
    """The op that computes the gradients of op `forward`
    (``"fuseops::<name>"``), as the profiler records it:
    ``fuseops::<name>_backward`` (``_forward`` taken off the name), unless
    the op's module declares another in ``BACKWARD_OPS`` (``{name: backward
    name}``), or None there when ATen's ops compute the gradients."""
    name = forward.split("::", 1)[1]
    for module in MODULES:
        declared = getattr(module, "BACKWARD_OPS", {})
        if name in declared:
            backward = declared[name]
            return None if backward is None else f"fuseops::{backward}"
    return f"fuseops::{name.removesuffix('_forward')}_backward"


__all__ = ["MODULES", "backward_op"]
