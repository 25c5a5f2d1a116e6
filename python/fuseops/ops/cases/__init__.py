"""The test and bench cases of the op modules: for each op module
``fuseops.ops.<op>``, the module ``fuseops.ops.cases.<op>`` of the same name,
found without a list. ``import fuseops`` does not import this package: a
user's program loads the ops, not the calls that test and measure them.

A cases module holds, for its op module's ops:

- ``samples(device)``: :class:`Sample` calls (``_sample.py``) that the
  conformance suite puts through opcheck, the compilers, the Meta kernels,
  the pybind module, ``out=`` and every CPU build;
- ``fuzz(draw)``: one random valid call (``_fuzz.py``), checked by the
  property-based fuzzer against the op's reference;
- ``bench_cases()``: its rows of ``python -m fuseops bench``
  (``_bench_case.py``);
- ``export_cases()``: the calls the ONNX and ExecuTorch tests export
  (``fuseops/ops/_export.py``), where the op module has export forms;
- ``autocast_cases()`` (``_autocast.py``) where the op has an autocast
  kernel, and ``row_reduction_cases()`` (``_threads.py``) where its result
  reduces rows, for the autocast and thread-count tests.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from ._sample import Sample


def _discover() -> tuple[ModuleType, ...]:
    names = sorted(
        info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_")
    )
    return tuple(importlib.import_module(f"{__name__}.{name}") for name in names)


#: The cases modules, sorted by name: one per op module, in the order of
#: ``fuseops.ops.MODULES``.
MODULES = _discover()


def op_name(module: ModuleType) -> str:
    """The op module's name of an op or cases module: ``"rms_norm"``."""
    return module.__name__.rsplit(".", 1)[-1]


def of(op_module: ModuleType) -> ModuleType:
    """The cases module of the op module `op_module`."""
    return importlib.import_module(f"{__name__}.{op_name(op_module)}")


def samples(device) -> list[Sample]:
    """Every cases module's samples on `device`, module by module."""
    return [sample for module in MODULES for sample in module.samples(device)]


__all__ = ["MODULES", "Sample", "of", "op_name", "samples"]
