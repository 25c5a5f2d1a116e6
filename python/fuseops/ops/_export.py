"""What fuseops.onnx and fuseops.executorch share: the program they export
(:func:`exported_program`); the export forms the op modules declare,
collected into one table per backend; the fuseops ops a graph calls without
one; why an op has none; and the calls their tests
export.

Each op module (``fuseops/ops/<op>.py``) declares:

- ``onnx_translations()``: ``{torch.ops.fuseops.<op>.<overload>: ONNX
  function}`` for its inference ops, the functions written with the opset-23
  operators and helpers of :mod:`fuseops.ops._onnx` (imported in the
  function's body: it imports onnxscript, which ``import fuseops`` does not);
- ``executorch_decompositions()``: ``{overload: decomposition}``,
  plain-PyTorch functions of core ATen operators computing the same, with the
  helpers of :mod:`fuseops.ops._executorch`;
- ``NOT_EXPORTED``: ``{(op name, ...): why}`` for its ops that have neither
  for a reason of their own (losses, weight preparation, still to come);
  the backward ops and the ``out=`` overloads have none by rule
  (:func:`rule_reason`);
and its cases module (``fuseops/ops/cases/<op>.py``):

- ``export_cases()``: :class:`ExportCase` calls of each exported overload
  (dtypes, shapes, options), which ``tests_py/test_onnx.py`` and
  ``tests_py/test_executorch.py`` export, run and compare with the op.

A module without inference ops to export declares only ``NOT_EXPORTED``.
Every overload of every fuseops op is either in both tables or has a reason:
the tests check it.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Optional

import torch

#: The reasons shared by several op modules' ``NOT_EXPORTED``.
PREPARES_WEIGHTS = "they prepare the weights once, before export"

TRAINING_OPS = (
    "backward ops (*_backward) and the forward ops returning statistics for them (*_forward)"
)
OUT_OVERLOADS = "out= overloads (*.out, *_out) and rope_"
_OUT_REASON = (
    "they write into preallocated tensors; an inference model to export calls the "
    "functional forms (no out=)"
)


def rule_reason(name: str, overload: str, runs: str) -> Optional[str]:
    """Why the overload ``name.overload`` has no export form by rule, or None:
    a backward op (or a ``*_forward`` op, which returns statistics for one)
    is training, and ``runs`` (``"ONNX export"``) is for inference; an
    ``out=`` overload writes into preallocated tensors."""
    if name.endswith(("_backward", "_forward")):
        return f"training ops; {runs} is for inference"
    if overload == "out" or overload.endswith("_out"):
        return _OUT_REASON
    return None


def table(modules: tuple[ModuleType, ...], declaration: str) -> dict[Any, Callable]:
    """``{overload: function}`` from every op module's ``declaration()``
    (``"onnx_translations"`` or ``"executorch_decompositions"``)."""
    found: dict[Any, Callable] = {}
    for module in modules:
        declare = getattr(module, declaration, None)
        if declare is None:
            continue
        for key, function in declare().items():
            if key in found:
                raise RuntimeError(f"{key} is declared twice ({module.__name__})")
            found[key] = function
    return found


def reasons(modules: tuple[ModuleType, ...], runs: str) -> dict[str, str]:
    """``{ops: why}``: the rules' reasons (see :func:`rule_reason`), then the
    op modules' ``NOT_EXPORTED``, the ops of one reason named together."""
    names: dict[str, list[str]] = {}
    for module in modules:
        for ops, why in getattr(module, "NOT_EXPORTED", {}).items():
            names.setdefault(why, []).extend(ops)
    return {
        TRAINING_OPS: f"training ops; {runs} is for inference",
        OUT_OVERLOADS: _OUT_REASON,
        **{", ".join(ops): why for why, ops in names.items()},
    }


def reason(modules: tuple[ModuleType, ...], op, runs: str) -> Optional[str]:
    """Why the overload ``op`` has no export form, or None when it has no
    reason to go without (by rule or by its module's ``NOT_EXPORTED``)."""
    name = op._schema.name.split("::", 1)[1]
    found = rule_reason(name, op._overloadname, runs)
    for module in modules:
        for ops, why in getattr(module, "NOT_EXPORTED", {}).items():
            if name in ops:
                found = found or why
    return found


def exported_program(model, args, kwargs: dict, strict: bool = False):
    """``model`` if it is an ``ExportedProgram``, else
    ``torch.export.export(model, args)`` with the export keywords of
    ``kwargs`` (``kwargs``, ``dynamic_shapes``: popped from it)."""
    if isinstance(model, torch.export.ExportedProgram):
        return model
    return torch.export.export(
        model,
        tuple(args) if isinstance(args, (tuple, list)) else (args,),
        kwargs=kwargs.pop("kwargs", None),
        dynamic_shapes=kwargs.pop("dynamic_shapes", None),
        strict=strict,
    )


def missing_ops(program, table) -> list[str]:
    """The fuseops ops (``torch.ops.fuseops.<op>.<overload>``) that the graph
    of ``program`` (a ``torch.export.ExportedProgram``) calls and ``table``
    has no function for, sorted."""
    found = set()
    for module in program.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            target = node.target
            if (
                node.op == "call_function"
                and isinstance(target, torch._ops.OpOverload)
                and target.namespace == "fuseops"
                and target not in table
            ):
                found.add(f"torch.ops.{target}")
    return sorted(found)


@dataclass(frozen=True)
class ExportCase:
    """One call of an exported overload ``op`` for the export tests:
    ``call(*args)`` (``op(*args)`` when ``call`` is None, else ``op`` with the
    case's other arguments fixed), the tensors ``args`` being the exported
    module's inputs. The tests compare the runtime's results with the eager
    op's within float32 rounding order (``tests_py/support/export_check.py``);
    ``rtol`` and ``atol`` (a fraction of the largest expected magnitude) widen
    those bounds. ``not_run_by`` names the backends (``"onnx"``,
    ``"executorch"``) whose runtime cannot run the call, and why."""

    op: Any
    label: str
    args: tuple
    call: Optional[Callable] = None
    rtol: float = 0.0
    atol: float = 0.0
    not_run_by: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        """The op's name without namespace, e.g. ``rms_norm``."""
        return self.op._schema.name.split("::", 1)[1]

    def __call__(self, *args):
        return (self.op if self.call is None else self.call)(*args)


#: The dtypes of the export cases, in the order they are drawn.
EXPORT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def randn(*shape, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    """A standard normal tensor times ``scale``, drawn in float32, in ``dtype``."""
    return (torch.randn(*shape) * scale).to(dtype)


#: Where a case cannot run in ONNX Runtime: its CPU provider has no float64
#: Erf, so the erf form of GELU exports for float64 (ONNX ``Gelu``) but does
#: not run there.
NO_FLOAT64_ERF = (("onnx", "ONNX Runtime's CPU provider has no float64 Erf"),)


def gelu_limits(dtype: torch.dtype, approximate: Optional[str]) -> tuple[tuple[str, str], ...]:
    """``not_run_by`` of a case computing GELU's ``approximate`` form in ``dtype``."""
    return NO_FLOAT64_ERF if approximate == "none" and dtype == torch.float64 else ()


def elementwise_cases(op, call, special_values, approximate: Optional[str] = None) -> list:
    """Cases of the elementwise ``call`` of ``op``: random inputs of two
    shapes and ``special_values``, in every dtype (``approximate``: the GELU
    form it computes, if any)."""
    special = torch.tensor(special_values)
    return [
        ExportCase(
            op,
            f"{dtype} {shape}",
            (randn(*shape, dtype=dtype, scale=3.0),),
            call,
            not_run_by=gelu_limits(dtype, approximate),
        )
        for dtype in EXPORT_DTYPES
        for shape in ((4, 33), (2, 3, 16))
    ] + [
        ExportCase(
            op,
            f"{dtype} special values",
            (special.to(dtype),),
            call,
            not_run_by=gelu_limits(dtype, approximate),
        )
        for dtype in EXPORT_DTYPES
    ]
