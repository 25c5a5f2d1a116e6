"""fuseops.onnx: models calling fuseops ops exported with torch.onnx.export
(dynamo=True) and fuseops' translation table, run by ONNX Runtime's CPU
provider and compared with the fuseops ops themselves.

Each translated op is exported once, in one module that calls it on every
case (shapes, dtypes, options) its op module declares (``export_cases()``),
the cases' tensors being the graph's inputs; the tolerances are those of
support/export_check.py. A case whose ``not_run_by`` names ONNX Runtime (the
float64 erf GELU: its CPU provider has no float64 Erf) is left out here.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

pytest.importorskip("onnx", reason="onnx is not installed (pip install 'fuseops[onnx]')")
pytest.importorskip(
    "onnxscript", reason="onnxscript is not installed (pip install 'fuseops[onnx]')"
)
ort = pytest.importorskip(
    "onnxruntime", reason="onnxruntime is not installed (pip install 'fuseops[onnx]')"
)

import fuseops  # noqa: E402
import fuseops.onnx as fonnx  # noqa: E402
from fuseops.ops._export import randn  # noqa: E402

from support import export_check  # noqa: E402

# torch 2.13's exporter deep-copies pytree specs through typing_extensions,
# which warns about torch's own deprecated LeafSpec check.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning"
)

ops = torch.ops.fuseops


# --- running an exported model -------------------------------------------------


def _ort_value(t: torch.Tensor):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: hand over the bits
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            t.view(torch.int16).numpy(), onnx_element_type=16
        )
    return ort.OrtValue.ortvalue_from_numpy(t.numpy())


def _torch_value(value) -> torch.Tensor:
    if value.data_type() == "tensor(bfloat16)":
        out = torch.empty(value.shape(), dtype=torch.bfloat16)
        ctypes.memmove(out.data_ptr(), value.data_ptr(), value.tensor_size_in_bytes())
        return out
    return torch.from_numpy(value.numpy())


def run_onnx(program, inputs) -> list[torch.Tensor]:
    """The outputs of `program` (a torch.onnx.ONNXProgram) run by ONNX
    Runtime's CPU provider on `inputs`."""
    session = ort.InferenceSession(
        program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]
    assert len(names) == len(inputs), "an input was folded into the graph"
    feeds = {name: _ort_value(t) for name, t in zip(names, inputs)}
    return [_torch_value(v) for v in session.run_with_ort_values(None, feeds)]


def export_and_compare(cases, table=None):
    """Exports one module calling every case, runs it in ONNX Runtime and
    compares each output with the eager fuseops result."""
    kwargs = {} if table is None else {"custom_translation_table": table}
    return export_check.export_and_compare(
        cases, lambda model, inputs: fonnx.export(model, inputs, verbose=False, **kwargs), run_onnx
    )


def op_types(program) -> set[str]:
    return {node.op_type for node in program.model_proto.graph.node}


# --- the tests -------------------------------------------------------------------

TABLE = fonnx.custom_translation_table()


def test_every_overload_is_translated_or_says_why_not():
    export_check.check_complete(TABLE, "ONNX export")
    assert "training ops; ONNX export is for inference" in fonnx.NOT_TRANSLATED.values()


@pytest.mark.parametrize("name", export_check.op_names(TABLE))
def test_op_runs_in_onnx_runtime_as_fuseops(name):
    cases = export_check.export_cases(name, "onnx")
    # Every overload the table translates is among the cases.
    assert {case.op for case in cases} == {
        op for op in TABLE if op._schema.name == f"fuseops::{name}"
    }
    program = export_and_compare(cases)
    # The standard operators where they match the op.
    standard = {
        "rms_norm": "RMSNormalization",
        "fused_add_rms_norm": "RMSNormalization",
        "layer_norm": "LayerNormalization",
        "gelu": "Gelu",
        "geglu": "Gelu",
        "bias_gelu": "Gelu",
        "relu": "Relu",
        "int8_dynamic_linear": "MatMulInteger",
        "int4_dynamic_linear": "MatMulInteger",
    }
    if name in standard:
        assert standard[name] in op_types(program)
    assert not any(domain.domain.startswith("pkg.") for domain in program.model_proto.opset_import)


def test_a_wrong_translation_fails():
    """The comparison catches a translation that gets the math slightly
    wrong: rms_norm with eps 1e-5 where the op has 1e-6."""
    export_check.check_a_wrong_eps_fails(TABLE, export_and_compare)


def test_an_op_without_a_translation_is_named():
    export_check.check_an_op_without_a_table_entry_is_named(
        lambda module, args: fonnx.export(module, args, verbose=False)
    )


# float32 logits: the graphs differ only in float32 rounding order (1e-5 of
# the largest logit, as tests_py/test_transformers.py allows between patched
# and unpatched models). With int8 activations ("w8a8", "w4a8") an
# activation that lands on a rounding boundary of its int8 step in one
# float32 order but not the other moves by one step (1/127 of its row's
# largest value), which the following layers carry into the logits: 2e-3.
LLAMA_TOLERANCE = {None: 1e-5, "w8a16": 1e-5, "w4a16": 1e-5, "w8a8": 2e-3, "w4a8": 2e-3}


@pytest.mark.parametrize("quantize", [None, "w8a16", "w8a8", "w4a16", "w4a8"])
def test_patched_tiny_llama_runs_in_onnx_runtime(quantize):
    model, input_ids, expected = export_check.tiny_llama(quantize, group_size=32)
    with torch.no_grad():
        program = fonnx.export(model, (input_ids,), verbose=False)
    graph = program.model_proto.graph
    # The fuseops ops became ONNX operators, not calls into a custom domain.
    assert "RMSNormalization" in op_types(program)
    if quantize in ("w8a8", "w4a8"):
        assert "MatMulInteger" in op_types(program)
    assert all(node.domain in ("", "ai.onnx") for node in graph.node), {
        node.domain for node in graph.node
    }
    (logits,) = run_onnx(program, [input_ids])
    tolerance = LLAMA_TOLERANCE[quantize] * expected.abs().max().item()
    torch.testing.assert_close(logits, expected, rtol=0, atol=tolerance)


def test_torch_onnx_export_takes_the_table():
    """torch.onnx.export itself: fails on a fuseops op without the table,
    exports with it."""

    class Norm(torch.nn.Module):
        def forward(self, x):
            return fuseops.silu(fuseops.rms_norm(x))

    x, model = randn(3, 16), Norm().eval()
    with pytest.raises(torch.onnx.OnnxExporterError, match=r"fuseops\.rms_norm\.default"):
        torch.onnx.export(model, (x,), dynamo=True, opset_version=23, verbose=False)
    program = torch.onnx.export(
        model,
        (x,),
        dynamo=True,
        opset_version=23,
        verbose=False,
        custom_translation_table=fonnx.custom_translation_table(),
    )
    (y,) = run_onnx(program, [x])
    torch.testing.assert_close(y, model(x), rtol=2e-6, atol=2e-6)


def test_bench_onnx_command(tmp_path):
    """python -m fuseops bench --onnx: a row per variant with the .onnx
    file's size and ONNX Runtime's and PyTorch's times; the int8 program is
    the smaller, and its logits are PyTorch's (float32 rounding order
    apart)."""
    export_check.check_bench_command(
        "onnx", ".onnx", "ONNX Runtime", ["float32", "w8a16"], tmp_path
    )


def test_bench_onnx_refuses_an_unknown_variant(tmp_path):
    export_check.check_bench_refuses_an_unknown_variant("onnx", tmp_path)
