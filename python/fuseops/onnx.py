"""ONNX export of models that call fuseops ops: ONNX functions for the
inference ops, for ``torch.onnx.export(..., dynamo=True)``.

``torch.onnx.export`` does not know the ``torch.ops.fuseops.*`` ops: a
model calling them fails to export unless it is given an ONNX function for
each one. :func:`custom_translation_table` returns them (keys: the ops'
overloads, values: functions writing standard ONNX opset-23 operators),
and :func:`export` calls ``torch.onnx.export`` with that table, opset 23,
after checking that every fuseops op in the model has a translation::

    onnx_program = fuseops.onnx.export(model, (x,), "model.onnx")

Each op family writes its own functions, beside its wrappers and reference:
``onnx_translations()`` in ``fuseops/ops/<op>.py`` (``rms_norm`` in
``fuseops/ops/rms_norm.py``, with the helpers they share in
``fuseops/ops/_onnx.py``); this module collects them
(``fuseops/ops/_export.py``). Each function computes what the op computes,
in the op's precision: bfloat16 and float16 inputs are cast to float32,
computed there and rounded once to their dtype, as the fuseops kernels do
(float64 stays float64). The ONNX graph may order float sums differently
(matrix products, row reductions), as any two implementations of the op do.
What each op becomes is in python/README.md ("Deploying to ONNX Runtime")
and in each ``onnx_translations()``'s docstring: the norms are ONNX
``RMSNormalization`` and ``LayerNormalization``, the GELUs ONNX ``Gelu``,
relu ``Relu``, the dynamic linears ``MatMulInteger``; rope, the weight-only
linears and decode_attention are decomposed into standard operators.

Not translated (:data:`NOT_TRANSLATED` says why for each): the backward
ops (training), the ``out=`` overloads (an exported graph is functional),
the losses (``cross_entropy``, the fused LM head, ``jsd``), the
quantization and packing ops (they prepare weights once, before export),
and, still to come, ``causal_conv1d_update`` (an in-place state update).
``moe_experts`` is exported dense: every expert on every token, each
token keeping its routed experts' weighted results.

Limits: shapes are static (the fuseops ops' shape functions specialize
symbolic sizes, so ``torch.export`` with ``dynamic_shapes`` fails on them).
rope's positions are gathered with ONNX ``Gather``, which takes a negative
position ``p >= -max_pos`` as ``max_pos + p`` where the op raises.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

try:
    from .ops import _onnx
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "fuseops.onnx needs onnxscript, onnx and (to run the models) onnxruntime: "
        "pip install 'fuseops[onnx]'"
    ) from error
from .ops import MODULES, _export

#: The opset the functions write (RMSNormalization is opset 23).
OPSET = _onnx.OPSET


def custom_translation_table() -> dict[Any, Callable]:
    """``{torch.ops.fuseops.<op>.<overload>: ONNX function}`` for
    ``torch.onnx.export(..., dynamo=True, custom_translation_table=...)``
    (a new dict each call: add your own translations to it)."""
    return _export.table(MODULES, "onnx_translations")


def export(model, args=(), path=None, **kwargs):
    """``torch.onnx.export(model, args, path, dynamo=True, opset_version=23,
    custom_translation_table=custom_translation_table(), **kwargs)``: an
    ``onnx_program`` (``torch.onnx.ONNXProgram``), also saved to ``path``
    when given. ``kwargs`` go to ``torch.onnx.export`` (``dynamic_shapes``,
    ``kwargs``, ``input_names``, ...); a ``custom_translation_table`` there
    adds to fuseops' (and wins for the ops it names).

    The model is first captured with ``torch.export.export`` (or ``model``
    is already an ``ExportedProgram``); a fuseops op without a translation
    raises ``NotImplementedError`` naming it."""
    if kwargs.get("dynamo", True) is not True:
        raise ValueError("fuseops.onnx.export: fuseops ops export with dynamo=True only")
    table = custom_translation_table()
    table.update(kwargs.pop("custom_translation_table", None) or {})
    kwargs.setdefault("opset_version", OPSET)
    kwargs.pop("dynamo", None)
    program = _export.exported_program(model, args, kwargs)
    missing = untranslated_ops(program, table)
    if missing:
        raise NotImplementedError(
            "fuseops.onnx: no ONNX translation for "
            + ", ".join(missing)
            + " (the fuseops ops with one: fuseops.onnx.custom_translation_table(); "
            "see fuseops.onnx.NOT_TRANSLATED for why the others have none)"
        )
    return torch.onnx.export(
        program, (), path, dynamo=True, custom_translation_table=table, **kwargs
    )


def untranslated_ops(program, table=None) -> list[str]:
    """The fuseops ops (``torch.ops.fuseops.<op>.<overload>``) that the graph
    of ``program`` (a ``torch.export.ExportedProgram``) calls and ``table``
    (default :func:`custom_translation_table`) has no function for."""
    return _export.missing_ops(program, custom_translation_table() if table is None else table)


#: The fuseops ops without a translation, and why (the op modules'
#: ``NOT_EXPORTED`` and the rules of fuseops/ops/_export.py).
NOT_TRANSLATED = _export.reasons(MODULES, "ONNX export")
