"""ExecuTorch export of models that call fuseops ops: decompositions of the
inference ops into core ATen operators, for a ``.pte`` program that
ExecuTorch's portable (and XNNPACK) kernels run.

ExecuTorch has no kernels for the ``torch.ops.fuseops.*`` ops: lowering a
model that calls them fails (``Missing out variants: {'fuseops::rms_norm',
...}``). :func:`decomposition_table` maps each inference op's overload to a
plain-PyTorch function computing the same thing with core ATen operators,
and :func:`export` captures the model with ``torch.export``, runs
``ExportedProgram.run_decompositions`` with that table (on top of
``torch.export.default_decompositions()``), checks that no fuseops op is
left, and lowers the result with ``executorch.exir.to_edge_transform_and_lower``
(with the XNNPACK partitioner when ExecuTorch has it) and
``.to_executorch()``::

    program = fuseops.executorch.export(model, (x,), "model.pte")

Each op family writes its own decompositions, beside its wrappers and
reference: ``executorch_decompositions()`` in ``fuseops/ops/<op>.py``
(``rms_norm`` in ``fuseops/ops/rms_norm.py``, with the helpers they share in
``fuseops/ops/_executorch.py``); this module collects them
(``fuseops/ops/_export.py``). Each decomposition computes what the op
computes, in the op's precision: bfloat16 and float16 inputs are cast to
float32, computed there and rounded once to their dtype, as the fuseops
kernels do (float64 stays float64). The decomposed graph may order float
sums differently (matrix products, row reductions), as any two
implementations of the op do. Each is the math of the op's ONNX function
(:mod:`fuseops.onnx`) written with ATen operators, with two of XNNPACK's
limits worked around: its GELU ignores ``approximate`` (the tanh form is
written out) and its float16 clamp turns NaN into 0 (``relu`` is a
``where``). The quantized linears keep their packed int8/int4 weights in
the program and dequantize them in the graph; the dynamic ones quantize the
activations per row as the op does and sum the integer products exactly.

Not decomposed (:data:`NOT_DECOMPOSED` says why for each): the backward
ops (training), the ``out=`` overloads (an exported graph is functional),
the losses (``cross_entropy``, the fused LM head, ``jsd``), the
quantization and packing ops (they prepare weights once, before export),
and, still to come, ``causal_conv1d_update`` (an in-place state update).
``moe_experts`` is exported dense: every expert on every token, each
token keeping its routed experts' weighted results. :func:`export` raises ``NotImplementedError`` naming any of them
a model calls.

Limits: shapes are static (the fuseops ops' shape functions specialize
symbolic sizes, so ``torch.export`` with ``dynamic_shapes`` fails on them).
The decompositions run on ExecuTorch's kernels, not fuseops', so they have
ExecuTorch's speed, not the fused kernels'. rope's positions index the
cache as ``aten.index`` does (a negative position ``p >= -max_pos`` is
taken as ``max_pos + p`` where the op raises).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

try:
    from executorch.exir import to_edge_transform_and_lower
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "fuseops.executorch needs ExecuTorch: pip install 'fuseops[executorch]'"
    ) from error

from .ops import MODULES, _export


def decomposition_table() -> dict[Any, Callable]:
    """``{torch.ops.fuseops.<op>.<overload>: decomposition}`` for
    ``ExportedProgram.run_decompositions`` (a new dict each call: add your
    own decompositions to it, or merge it into
    ``torch.export.default_decompositions()``, as :func:`decompose` does)."""
    return _export.table(MODULES, "executorch_decompositions")


def undecomposed_ops(program, table=None) -> list[str]:
    """The fuseops ops (``torch.ops.fuseops.<op>.<overload>``) that the graph
    of ``program`` (a ``torch.export.ExportedProgram``) calls and ``table``
    (default :func:`decomposition_table`) has no decomposition for."""
    return _export.missing_ops(program, decomposition_table() if table is None else table)


def decompose(program, table=None):
    """``program`` (a ``torch.export.ExportedProgram``) with every fuseops op
    replaced by its decomposition and the rest decomposed to core ATen
    (``torch.export.default_decompositions()`` updated with ``table``,
    default :func:`decomposition_table`). Raises ``NotImplementedError``
    naming the fuseops ops the table has no decomposition for."""
    table = decomposition_table() if table is None else table
    missing = undecomposed_ops(program, table)
    if missing:
        raise NotImplementedError(
            "fuseops.executorch: no decomposition for "
            + ", ".join(missing)
            + " (the fuseops ops with one: fuseops.executorch.decomposition_table(); "
            "see fuseops.executorch.NOT_DECOMPOSED for why the others have none)"
        )
    full = torch.export.default_decompositions()
    full.update(table)
    return program.run_decompositions(full)


def _default_partitioners() -> list:
    try:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner,
        )
    except ImportError:  # pragma: no cover - ExecuTorch built without XNNPACK
        return []
    return [XnnpackPartitioner()]


def export(model, args=(), path=None, **kwargs):
    """The ExecuTorch program (``executorch.exir.ExecutorchProgramManager``)
    of ``model`` called on ``args``, also saved to ``path`` (a ``.pte``
    file) when given.

    ``model`` is captured with ``torch.export.export(model, args,
    kwargs=kwargs.pop("kwargs"), strict=False)`` (or is already an
    ``ExportedProgram``), decomposed by :func:`decompose` with
    :func:`decomposition_table` (plus ``decomposition_table=`` entries,
    which win for the ops they name), then lowered with ``to_edge_transform_and_lower(program,
    partitioner=...)`` and ``.to_executorch()``. ``partitioner`` defaults to
    ExecuTorch's XNNPACK partitioner where ExecuTorch has it (``[]``: the
    portable kernels only); ``compile_config`` goes to
    ``to_edge_transform_and_lower``, ``backend_config`` to
    ``to_executorch``. A fuseops op without a decomposition raises
    ``NotImplementedError`` naming it."""
    table = decomposition_table()
    table.update(kwargs.pop("decomposition_table", None) or {})
    partitioner = kwargs.pop("partitioner", None)
    compile_config = kwargs.pop("compile_config", None)
    backend_config = kwargs.pop("backend_config", None)
    if isinstance(model, torch.export.ExportedProgram) and kwargs:
        raise TypeError(
            "fuseops.executorch.export: an ExportedProgram takes no export arguments, got "
            + ", ".join(sorted(kwargs))
        )
    program = _export.exported_program(model, args, kwargs, strict=kwargs.pop("strict", False))
    if kwargs:
        raise TypeError(
            "fuseops.executorch.export: unexpected keyword arguments " + ", ".join(sorted(kwargs))
        )
    program = decompose(program, table)
    edge = to_edge_transform_and_lower(
        program,
        partitioner=_default_partitioners() if partitioner is None else list(partitioner),
        compile_config=compile_config,
    )
    executorch_program = edge.to_executorch(backend_config)
    if path is not None:
        with open(path, "wb") as file:
            executorch_program.write_to_file(file)
    return executorch_program


#: The fuseops ops without a decomposition, and why (the op modules'
#: ``NOT_EXPORTED`` and the rules of fuseops/ops/_export.py).
NOT_DECOMPOSED = _export.reasons(MODULES, "an ExecuTorch program")
