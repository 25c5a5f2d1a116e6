"""fuseops.executorch: models calling fuseops ops exported to ExecuTorch
programs (the fuseops ops decomposed into core ATen operators, lowered with
the XNNPACK partitioner), run by ExecuTorch's Python runtime and compared
with the fuseops ops themselves.

Each decomposed op is exported once, in one module that calls it on the
cases (shapes, dtypes, options) its op module declares (``export_cases()``),
the cases' tensors being the program's inputs; the tolerances are those of
support/export_check.py. Every float32 case runs; of the float16, bfloat16
and float64 cases, one per overload and mix of dtypes
(``export_check.select_cases``; see test_op_runs_in_executorch_as_fuseops).

With ``kernels="fuseops"`` the ops stay in the program and fuseops' own
kernels run them (``fuseops.executorch.load_kernels``): every op's cases in
one program, equal bit for bit to the ops; the tiny Llama, float and
quantized; and a fresh process that needs ``load_kernels`` to run such a
program.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

with warnings.catch_warnings():
    # ExecuTorch 1.5.1 reads its operator list with importlib.resources'
    # deprecated read_text when imported.
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip(
        "executorch", reason="executorch is not installed (pip install 'fuseops[executorch]')"
    )
    from executorch.runtime import Runtime

    import fuseops  # noqa: E402
    import fuseops.executorch as fet  # noqa: E402

from fuseops.ops._export import randn  # noqa: E402

from support import export_check  # noqa: E402

pytestmark = [
    # torch 2.13's exporter deep-copies pytree specs through typing_extensions,
    # which warns about torch's own deprecated LeafSpec check.
    pytest.mark.filterwarnings(
        "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning"
    ),
    # ExecuTorch 1.5.1 reads its schemas with importlib.resources' deprecated
    # read_text/read_binary.
    pytest.mark.filterwarnings("ignore:read_(text|binary) is deprecated:DeprecationWarning"),
]

ops = torch.ops.fuseops


# --- running an exported program ------------------------------------------------


def run_pte(program, inputs) -> list[torch.Tensor]:
    """The outputs of `program` (an ExecutorchProgramManager) run by
    ExecuTorch's runtime on `inputs`."""
    method = Runtime.get().load_program(program.buffer).load_method("forward")
    return list(method.execute([t.contiguous() for t in inputs]))


def export_and_compare(cases, table=None):
    """Exports one module calling every case, runs it in ExecuTorch's runtime
    and compares each output with the eager fuseops result."""
    kwargs = {} if table is None else {"decomposition_table": table}
    return export_check.export_and_compare(
        cases, lambda model, inputs: fet.export(model, inputs, **kwargs), run_pte
    )


def fuseops_ops_left(program) -> set[str]:
    """The fuseops ops named anywhere in the lowered program's graphs."""
    graph = program.exported_program().graph_module
    return {
        str(node.target)
        for module in graph.modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
        if node.op == "call_function" and "fuseops" in str(node.target)
    }


# --- the tests -------------------------------------------------------------------

TABLE = fet.decomposition_table()


def test_every_overload_is_decomposed_or_says_why_not():
    export_check.check_complete(TABLE, "an ExecuTorch program")
    assert "training ops; an ExecuTorch program is for inference" in fet.NOT_DECOMPOSED.values()


@pytest.mark.parametrize("name", export_check.op_names(TABLE))
def test_op_runs_in_executorch_as_fuseops(name):
    cases = export_check.export_cases(name, "executorch")
    # Every overload the table decomposes is among the cases.
    assert {case.op for case in cases} == {
        op for op in TABLE if op._schema.name == f"fuseops::{name}"
    }
    # Lowering and running the program takes time in proportion to its
    # cases. In float16 and bfloat16 a decomposition's graph is its float32
    # graph between casts to and from float32; in float64, the same graph in
    # float64. So every float32 case runs (each option and shape), and in
    # each other dtype each overload runs once per mix of dtypes among its
    # tensors (a float32 weight or cache beside a half input), with its last
    # declared case: the edge case where there is one (special values, such
    # as the float16 NaNs that XNNPACK's relu clamp would turn into 0).
    # test_onnx.py runs every case.
    selected = export_check.select_cases(cases, (torch.float32,))
    assert {case.op for case in selected} == {case.op for case in cases}
    assert {export_check.dtype_of(case) for case in selected} == {
        export_check.dtype_of(case) for case in cases
    }
    program = export_and_compare(selected)
    assert not fuseops_ops_left(program)


def test_a_wrong_decomposition_fails():
    """The comparison catches a decomposition that gets the math slightly
    wrong: rms_norm with eps 1e-5 where the op has 1e-6."""
    export_check.check_a_wrong_eps_fails(TABLE, export_and_compare)


def test_an_op_without_a_decomposition_is_named():
    export_check.check_an_op_without_a_table_entry_is_named(fet.export)


def test_plain_lowering_fails_without_the_decompositions():
    """What fuseops.executorch is for: ExecuTorch itself cannot lower a
    graph calling a fuseops op."""
    from executorch.exir import to_edge_transform_and_lower

    class Norm(torch.nn.Module):
        def forward(self, x):
            return fuseops.rms_norm(x)

    x = randn(3, 16)
    program = torch.export.export(Norm(), (x,), strict=False)
    with pytest.raises(Exception, match=r"fuseops::rms_norm"):
        to_edge_transform_and_lower(program).to_executorch()
    # fuseops.executorch.export takes the ExportedProgram as it is.
    (y,) = run_pte(fet.export(program, partitioner=[]), [x])
    torch.testing.assert_close(y, fuseops.rms_norm(x), rtol=2e-6, atol=2e-6)


def _export_tiny_llama(quantize, path):
    model, input_ids, expected = export_check.tiny_llama(quantize)
    with torch.no_grad():
        program = fet.export(model, (input_ids,), path)
    assert not fuseops_ops_left(program)
    (logits,) = run_pte(program, [input_ids])
    # float32 logits: the graphs differ only in float32 rounding order (1e-5
    # of the largest logit, as tests_py/test_transformers.py allows between
    # patched and unpatched models).
    tolerance = 1e-5 * expected.abs().max().item()
    torch.testing.assert_close(logits, expected, rtol=0, atol=tolerance)
    return os.path.getsize(path)


def test_patched_tiny_llama_runs_in_executorch(tmp_path):
    """A tiny Llama patched by fuseops.transformers.apply, float and with
    int8 weights (w8a16): the .pte programs' logits match PyTorch's, and the
    quantized program, which stores the int8 weights, is the smaller."""
    float_size = _export_tiny_llama(None, tmp_path / "float.pte")
    quantized_size = _export_tiny_llama("w8a16", tmp_path / "w8a16.pte")
    print(f"tiny Llama .pte: float32 {float_size} bytes, w8a16 {quantized_size} bytes")
    assert quantized_size < float_size


# --- fuseops' own kernels in the program (kernels="fuseops") ----------------------


def kernel_ops_called(program) -> set[str]:
    """The fuseops_executorch ops (out variants) the lowered program calls."""
    return {name for name in fuseops_ops_left(program) if name.startswith(fet.KERNEL_NAMESPACE)}


def test_every_op_runs_on_fuseops_kernels():
    """Every op with a decomposition, exported with kernels="fuseops" in one
    program of every op's selected export cases: the program calls fuseops'
    kernel for each overload instead of a decomposition, and its outputs are
    the op's, bit for bit (the same kernels on the same inputs; NaN where the
    op gives NaN)."""
    cases = [
        case
        for name in export_check.op_names(TABLE)
        for case in export_check.export_cases(name, "executorch")
    ]
    selected = export_check.select_cases(cases, (torch.float32,))
    assert {case.op for case in selected} == set(TABLE) == set(fet.kernel_ops())
    inputs = [t.contiguous() for case in selected for t in case.args]
    with torch.no_grad():
        model = export_check.Calls(selected).eval()
        expected = model(*inputs)
        program = fet.export(model, tuple(inputs), kernels="fuseops")
    assert kernel_ops_called(program) == {
        f"{fet.KERNEL_NAMESPACE}.{op._schema.name.split('::')[1]}.out"
        for op in {fet.kernel_ops()[case.op] for case in selected}
    }
    assert not fuseops_ops_left(program) - kernel_ops_called(program)
    got = run_pte(program, inputs)
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True, msg=f"output {i}")


@pytest.mark.parametrize("quantize", [None, "w8a16", "w4a8"])
def test_patched_tiny_llama_runs_on_fuseops_kernels(quantize):
    """The tiny Llama, float and quantized, exported with kernels="fuseops":
    its fuseops ops run as fuseops' kernels (the quantized linears on their
    packed weights, no dequantization in the graph), the logits PyTorch's
    (float32 rounding order apart, as in test_patched_tiny_llama_runs_in_executorch)."""
    model, input_ids, expected = export_check.tiny_llama(quantize)
    with torch.no_grad():
        program = fet.export(model, (input_ids,), kernels="fuseops")
    linear = {None: "linear", "w8a16": "int8_weight_only_linear", "w4a8": "int4_dynamic_linear"}
    called = kernel_ops_called(program)
    assert f"{fet.KERNEL_NAMESPACE}.fuseops_{linear[quantize]}.out" in called, called
    assert f"{fet.KERNEL_NAMESPACE}.fuseops_rms_norm.out" in called, called
    (logits,) = run_pte(program, [input_ids])
    tolerance = 1e-5 * expected.abs().max().item()
    torch.testing.assert_close(logits, expected, rtol=0, atol=tolerance)


def _norm_program_script(tmp_path) -> str:
    """Exports an rms_norm program on fuseops' kernels to tmp_path/norm.pte
    with its input and result in tmp_path/io.pt, and returns the first
    lines of a script that reads them (io) in a fresh process."""

    class Norm(torch.nn.Module):
        def forward(self, x):
            return fuseops.rms_norm(x, None, 1e-6)

    x = randn(3, 16)
    fet.export(Norm(), (x,), tmp_path / "norm.pte", kernels="fuseops")
    torch.save({"x": x, "y": fuseops.rms_norm(x, None, 1e-6)}, tmp_path / "io.pt")
    return f"""
import torch, fuseops.executorch as fet
from executorch.runtime import Runtime
io = torch.load({str(tmp_path / "io.pt")!r})
"""


def test_a_program_of_fuseops_kernels_needs_load_kernels(tmp_path):
    """In a fresh process ExecuTorch refuses the program, naming the missing
    kernel, until fuseops.executorch.load_kernels() registers fuseops'
    kernels (a second call does nothing); then it runs and returns the op's
    result."""

    script = (
        _norm_program_script(tmp_path)
        + f"""
try:
    Runtime.get().load_program({str(tmp_path / "norm.pte")!r}).load_method("forward")
    print("loaded without fuseops' kernels")
except RuntimeError:
    print("refused")
fet.load_kernels()
fet.load_kernels()
method = Runtime.get().load_program({str(tmp_path / "norm.pte")!r}).load_method("forward")
(y,) = method.execute([io["x"]])
torch.testing.assert_close(y, io["y"], rtol=0, atol=0)
print("ran")
"""
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["refused", "ran"], result.stdout
    assert "Missing operator" in result.stderr
    assert f"{fet.KERNEL_NAMESPACE}::fuseops_rms_norm.out" in result.stderr


def test_load_kernels_after_a_refused_kernel_registers_the_rest(tmp_path):
    """A kernel the library refuses (an out= overload, which returns
    nothing) fails load_kernels() naming it, without a C++ backtrace; the
    kernels registered before it stay, and the next call registers the
    others without registering any twice (which ExecuTorch would refuse).
    Fresh process: registration is per process."""

    script = (
        _norm_program_script(tmp_path)
        + f"""
good = dict(fet.kernel_ops())
order = list(good)
refused = torch.ops.fuseops.rms_norm.out
fet.kernel_ops = lambda: {{**{{op: good[op] for op in order[:3]}}, refused: None, **good}}
try:
    fet.load_kernels()
    print("accepted")
except RuntimeError as e:
    message = str(e)
    named = "fuseops_rms_norm_out" in message and "fuseops::rms_norm" in message
    print("refused" if named and "Exception raised" not in message else message)
fet.kernel_ops = lambda: good
fet.load_kernels()
method = Runtime.get().load_program({str(tmp_path / "norm.pte")!r}).load_method("forward")
(y,) = method.execute([io["x"]])
torch.testing.assert_close(y, io["y"], rtol=0, atol=0)
print("ran")
"""
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["refused", "ran"], result.stdout


def test_kernels_argument_is_checked():
    with pytest.raises(ValueError, match=r"fuseops\.executorch\.export: kernels must be one of"):
        fet.export(torch.nn.Identity(), (torch.ones(2),), kernels="xnnpack")


def test_load_kernels_says_when_fuseops_was_built_without_them(monkeypatch, tmp_path):
    monkeypatch.setattr(fet, "kernel_library_path", lambda: str(tmp_path / "missing.so"))
    with pytest.raises(RuntimeError, match=r"built without its ExecuTorch kernels"):
        fet.load_kernels()


def test_bench_executorch_command(tmp_path):
    """python -m fuseops bench --executorch: a row per variant with the
    .pte's size and both runtimes' times; the int8 programs (decomposed, and
    run by fuseops' kernels) are the smaller, and their logits are
    PyTorch's (float32 rounding order apart)."""
    export_check.check_bench_command(
        "executorch", ".pte", "ExecuTorch", ["float32", "w8a16", "w8a16+fuseops"], tmp_path
    )


def test_bench_executorch_refuses_an_unknown_variant(tmp_path):
    export_check.check_bench_refuses_an_unknown_variant("executorch", tmp_path)
