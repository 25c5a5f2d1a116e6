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

With ``kernels="fuseops"``, :func:`export` keeps the inference ops in the
program instead, as calls to the out variants of ``fuseops_executorch::fuseops_<op>``
(:func:`kernel_ops`), which fuseops' own kernels run: the fused and
quantized kernels at fuseops' speed, bit for bit what the ops return in
PyTorch. Those kernels are ``libfuseops_executorch.so`` (built with fuseops
when the executorch package is installed), which :func:`load_kernels`
registers with ExecuTorch's runtime; it runs the ops through torch's
dispatcher, so such a program runs where ExecuTorch's Python runtime runs
beside torch and fuseops (a server, a desktop), not in a runtime without
libtorch (a phone): there, the decomposed program.

Limits: shapes are static (the fuseops ops' shape functions specialize
symbolic sizes, so ``torch.export`` with ``dynamic_shapes`` fails on them).
The decompositions run on ExecuTorch's kernels, not fuseops', so they have
ExecuTorch's speed, not the fused kernels'. rope's positions index the
cache as ``aten.index`` does (a negative position ``p >= -max_pos`` is
taken as ``max_pos + p`` where the op raises).
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
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


#: How a program from :func:`export` computes the fuseops ops.
KERNELS = ("executorch", "fuseops")

#: The namespace of the ops that stand for fuseops' in a program of
#: ``kernels="fuseops"``.
KERNEL_NAMESPACE = "fuseops_executorch"

_kernel_lock = threading.Lock()
_kernel_library = None  # torch.library.Library defining the kernel ops
_kernel_ops: dict[Any, Any] = {}
_kernels_loaded = False
#: The kernels registered with ExecuTorch in this process, by name: each
#: once, also when an earlier call failed partway (ExecuTorch refuses a
#: kernel registered twice).
_kernels_registered: set[str] = set()


def _kernel_op_name(op) -> str:
    # The "fuseops_" prefix: ExecuTorch's partitioners match ops by name
    # without namespace, and XNNPACK's would take a "linear" or "relu" for
    # its own.
    name = "fuseops_" + op._schema.name.split("::")[1]
    return name if op._overloadname == "default" else f"{name}_{op._overloadname}"


def _define_kernel_op(library, op) -> None:
    # ExecuTorch's out variants: the functional schema with one mutable
    # output per result after the keyword-only marker, returning them.
    match = re.fullmatch(r"[\w:]+(?:\.\w+)?\((.*)\) -> (.*)", str(op._schema))
    if match is None:
        raise RuntimeError(f"fuseops.executorch: unexpected schema {op._schema}")
    arguments, results = match.group(1), match.group(2)
    count = len(op._schema.returns)
    name = _kernel_op_name(op)
    library.define(f"{name}({arguments}) -> {results}")
    aliases = [chr(ord("a") + i) for i in range(count)]
    outs = ["out"] if count == 1 else [f"out{i}" for i in range(count)]
    marker = ", " if "*" in arguments else ", *, "
    written = ", ".join(f"Tensor({a}!) {o}" for a, o in zip(aliases, outs))
    returned = ", ".join(f"Tensor({a}!)" for a in aliases)
    if count > 1:
        returned = f"({returned})"
    library.define(f"{name}.out({arguments}{marker}{written}) -> {returned}")

    def functional(*args, **kwargs):
        return op(*args, **kwargs)

    def out_variant(*args, **kwargs):
        written = [kwargs.pop(o) for o in outs]
        results = op(*args, **kwargs)
        for tensor, result in zip(written, results if count > 1 else (results,)):
            tensor.copy_(result)
        return tuple(written) if count > 1 else written[0]

    library.impl(name, functional, "CompositeExplicitAutograd")
    library.impl(f"{name}.out", out_variant, "CompositeExplicitAutograd")
    # The shapes are the fuseops op's own, from its Meta kernel.
    torch.library.register_fake(f"{KERNEL_NAMESPACE}::{name}", functional, lib=library)


def kernel_ops() -> dict[Any, Any]:
    """``{torch.ops.fuseops.<op>.<overload>: torch.ops.fuseops_executorch.<name>.default}``
    for every op of :func:`decomposition_table` (``<name>`` is
    ``fuseops_<op>``, or ``fuseops_<op>_<overload>`` for an overload other
    than the default: ``rope.single`` -> ``fuseops_rope_single``). Each stands for its fuseops op in a program of
    ``kernels="fuseops"``: the same schema, computing the same, with an ATen
    style out variant (``<name>.out(..., *, Tensor(a!) out) -> Tensor(a!)``,
    ``out0``, ``out1``, ... for several results) that ExecuTorch's
    ``to_executorch`` calls and fuseops' kernels implement. Defined once per
    process, on the first call."""
    global _kernel_library
    with _kernel_lock:
        if _kernel_library is None:
            library = torch.library.Library(KERNEL_NAMESPACE, "DEF")
            for op in decomposition_table():
                _define_kernel_op(library, op)
                _kernel_ops[op] = getattr(
                    getattr(torch.ops, KERNEL_NAMESPACE), _kernel_op_name(op)
                ).default
            _kernel_library = library
        return dict(_kernel_ops)


def kernel_library_path() -> str:
    """Where ``libfuseops_executorch.so`` is: ``fuseops/lib`` beside
    ``libfuseops.so``."""
    import fuseops

    return os.path.join(os.path.dirname(fuseops.__file__), "lib", "libfuseops_executorch.so")


def load_kernels() -> None:
    """Registers fuseops' kernels with ExecuTorch's runtime in this process,
    as ``fuseops_executorch::<name>.out`` for every op of :func:`kernel_ops`:
    what a program exported with ``kernels="fuseops"`` calls. Call it before
    loading such a program (:func:`export` calls it); a second call does
    nothing. Raises ``RuntimeError`` when fuseops was built without its
    ExecuTorch kernels (the executorch package was not installed when it was
    built) or a kernel is refused; the kernels registered before it stay
    registered, and a later call registers only the others."""
    global _kernels_loaded
    path = kernel_library_path()
    if not os.path.exists(path):
        raise RuntimeError(
            "fuseops.executorch.load_kernels: this fuseops was built without its ExecuTorch "
            f"kernels ({path} is missing): install the executorch package "
            "(pip install 'fuseops[executorch]'), then reinstall fuseops"
        )
    ops = kernel_ops()
    with _kernel_lock:
        if _kernels_loaded:
            return
        # The runtime's libexecutorch.so, whose registry the kernels join:
        # loaded first, the library's dependency on it resolves to it.
        from executorch.extension.pybindings import portable_lib  # noqa: F401

        library = ctypes.CDLL(path)
        register = library.fuseops_executorch_register
        register.argtypes = [ctypes.c_char_p] * 4 + [ctypes.c_size_t]
        register.restype = ctypes.c_int
        error = ctypes.create_string_buffer(1024)
        for op in ops:
            name = op._schema.name.split("::")[1]
            overload = "" if op._overloadname == "default" else op._overloadname
            kernel = f"{KERNEL_NAMESPACE}::{_kernel_op_name(op)}.out"
            if kernel in _kernels_registered:
                continue
            if register(name.encode(), overload.encode(), kernel.encode(), error, len(error)):
                raise RuntimeError(
                    f"fuseops.executorch.load_kernels: {kernel}: {error.value.decode()}"
                )
            _kernels_registered.add(kernel)
        _kernels_loaded = True


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
    ``NotImplementedError`` naming it.

    ``kernels`` (keyword, default ``"executorch"``): ``"fuseops"`` keeps the
    ops of :func:`kernel_ops` as calls to fuseops' kernels instead of
    decomposing them (and calls :func:`load_kernels`, so that the program
    runs in this process; another process calls it before loading the
    program)."""
    kernels = kwargs.pop("kernels", "executorch")
    if kernels not in KERNELS:
        raise ValueError(
            f"fuseops.executorch.export: kernels must be one of {KERNELS}, got {kernels!r}"
        )
    table = decomposition_table()
    if kernels == "fuseops":
        load_kernels()
        # Each op "decomposed" into its fuseops_executorch counterpart, which
        # no decomposition table touches.
        table.update(kernel_ops())
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
