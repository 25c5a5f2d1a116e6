"""The fuseops ops, one module per op family, found without a list.

Each public module here (a name without a leading underscore) holds, for its
ops: the public wrappers over ``torch.ops.fuseops`` (named in its
``__all__``; ``fuseops`` exports them), the plain-PyTorch references (the
module's functions named ``<op>_reference``; ``fuseops.reference`` exports
them as ``<op>``), ``bench_cases()`` (its rows of ``python -m fuseops
bench``) and ``samples(device)`` (the calls the conformance suite puts
through opcheck, the compilers, the Meta kernels, the pybind module, ``out=``
and every CPU build). A new op is a new module; nothing else here changes.

Every ``out=`` may share memory with the inputs (the result is that of the
inputs before the call); an ``out=`` whose elements overlap each other, two
outputs sharing memory, or an ``out=`` that must be resized while sharing an
input's memory are refused (README, "out= and memory shared with inputs").
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from ._sample import Sample


def _discover() -> tuple[ModuleType, ...]:
    # Sorted by name, so that everything collected from the modules (exports,
    # bench rows, samples) comes in the same order on every machine.
    names = sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
    return tuple(importlib.import_module(f"{__name__}.{name}") for name in names)


#: The op modules, sorted by name.
MODULES = _discover()


def exported(kind: str) -> dict:
    """Name -> object over every op module: the public wrappers
    (``kind="ops"``, each module's ``__all__``) or the references
    (``kind="references"``, functions named ``<op>_reference``, keyed by
    ``<op>``). Two modules giving the same name is an error."""
    found: dict = {}
    for module in MODULES:
        if kind == "ops":
            items = [(name, getattr(module, name)) for name in module.__all__]
        elif kind == "references":
            items = [
                (name[: -len("_reference")], obj)
                for name, obj in vars(module).items()
                if name.endswith("_reference")
                and not name.startswith("_")
                and getattr(obj, "__module__", None) == module.__name__
            ]
        else:
            raise ValueError(f"kind must be 'ops' or 'references', got {kind!r}")
        for name, obj in items:
            if name in found:
                raise ImportError(f"fuseops.ops: {name!r} is defined by two op modules")
            found[name] = obj
    return found


def samples(device) -> list[Sample]:
    """Every op module's samples on `device`, module by module."""
    return [sample for module in MODULES for sample in module.samples(device)]


__all__ = ["MODULES", "Sample", "exported", "samples"]
