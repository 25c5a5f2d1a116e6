"""What tests_py/test_onnx.py and tests_py/test_executorch.py share: the op
modules' export cases (``export_cases()``, fuseops/ops/_export.py), one
module calling a list of them, the comparison of a runtime's results with
the eager ops, the check that every fuseops overload is exported or says
why not, and the tiny Llama both export.

Tolerances. Both sides compute in float32 (float64 for float64 inputs) and
round once to the input's dtype; they differ only in the order of float32
operations (row sums, matrix products, fused multiply-adds, erf/tanh/exp
implementations), a few float32 ulps. So:

- float32 (and float64, whose export forms do the op's float64 math): rtol
  2e-6, atol 2e-6 times the largest magnitude of the case's expected result
  (a case's ``rtol``/``atol`` widen them: 1e-5 for the float matrix products
  of the weight-only linears, whose sums over K run in another order and,
  for int4, apply the group scales to the weight instead of to each group's
  sum);
- bfloat16 and float16: the float32 results round to the same value but
  where they straddle a rounding boundary, one unit in the last place apart:
  rtol the dtype's epsilon (7.8e-3, 9.8e-4), atol that epsilon times 1e-3 of
  the largest magnitude (values near 0).
- the dynamic (int8-activation) linears quantize the activations with the
  same float32 operations as the op, so the integer sums are equal and only
  the float32 epilogue's order differs: as float32 above.

A mismatch of the math (a wrong epsilon, a scale not applied, the pairs of
the other rope layout, the wrong half of a packed input) is orders of
magnitude above these bounds; each test file's test_a_wrong_... checks that
the comparison catches one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import fuseops.ops
import fuseops.ops.cases
from fuseops.ops import _export

HALF = (torch.float16, torch.bfloat16)


def op_names(table) -> list[str]:
    """The op names (``rms_norm``) of a table's overloads, sorted."""
    return sorted({key._schema.name.split("::", 1)[1] for key in table})


def export_cases(name: str, backend: str) -> list:
    """The export cases of the op ``name`` that ``backend``'s runtime runs
    (drawn with the current random state)."""
    return [
        case
        for module in fuseops.ops.cases.MODULES
        if hasattr(module, "export_cases")
        for case in module.export_cases()
        if case.name == name and backend not in dict(case.not_run_by)
    ]


def dtype_of(case) -> torch.dtype:
    """The dtype a case computes in: its first argument's (the op's input)."""
    return case.args[0].dtype


def select_cases(cases, all_of: tuple[torch.dtype, ...]) -> list:
    """Every case of ``cases`` whose input is in one of the dtypes ``all_of``
    and, of the others, only the last of each overload for each combination
    of floating dtypes among its tensors (a float32 weight or cache beside a
    bfloat16 input is a combination of its own). The op modules declare
    each dtype's plain case first and its edge cases (special values,
    partial rotary, bias) after it. Every overload still runs in every dtype
    (and mix of dtypes) it has cases in; the tensors are those ``cases``
    drew, so a kept case is the very call the full list makes."""

    def key(case):
        floats = {a.dtype for a in case.args if a.is_floating_point()}
        return case.op, dtype_of(case), frozenset(floats)

    last = {key(case): index for index, case in enumerate(cases) if dtype_of(case) not in all_of}
    kept = set(last.values())
    return [case for index, case in enumerate(cases) if dtype_of(case) in all_of or index in kept]


class Calls(torch.nn.Module):
    """Calls each case on its tensors (the module's inputs, in order) and
    returns every result, flattened."""

    def __init__(self, cases):
        super().__init__()
        self.cases = cases

    def forward(self, *inputs):
        results, i = [], 0
        for case in self.cases:
            args = inputs[i : i + len(case.args)]
            i += len(case.args)
            out = case(*args)
            results += list(out) if isinstance(out, (tuple, list)) else [out]
        return tuple(results)


def bounds(case, expected: torch.Tensor) -> tuple[float, float]:
    finite = expected[expected.isfinite()].double().abs()
    largest = finite.max().item() if finite.numel() else 1.0
    if expected.dtype in HALF:
        eps = torch.finfo(expected.dtype).eps
        rtol, atol = eps, eps * 1e-3 * largest
    else:
        rtol, atol = 2e-6, 2e-6 * largest
    return max(rtol, case.rtol), max(atol, case.atol * largest)


def export_and_compare(cases, export, run):
    """Exports one module calling every case (``export(model, inputs)``),
    runs the result (``run(program, inputs)``, a list of tensors) and
    compares each output with the eager fuseops result; returns the
    program."""
    inputs = [t for case in cases for t in case.args]
    with torch.no_grad():
        model = Calls(cases).eval()
        expected = model(*inputs)
        program = export(model, tuple(inputs))
    got = run(program, inputs)
    assert len(got) == len(expected)
    owners = []
    for case in cases:
        with torch.no_grad():
            out = case(*case.args)
        owners += [case] * (len(out) if isinstance(out, (tuple, list)) else 1)
    for i, (case, g, e) in enumerate(zip(owners, got, expected)):
        label = f"{case.name} {case.label} (output {i})"
        assert g.dtype == e.dtype and g.shape == e.shape, f"{label}: {g.dtype}{tuple(g.shape)}"
        rtol, atol = bounds(case, e)
        torch.testing.assert_close(
            g, e, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{label}: {m}"
        )
    return program


def check_a_wrong_eps_fails(table, export_and_compare) -> None:
    """The comparison catches an export form that gets the math slightly
    wrong: ``table``'s rms_norm given eps 1e-5 where the op has 1e-6
    (``export_and_compare(cases, table=...)``: a test file's)."""
    ops = torch.ops.fuseops
    rms_norm = table[ops.rms_norm.default]
    wrong = {ops.rms_norm.default: lambda x, w=None, eps=None: rms_norm(x, w, 1e-5)}
    cases = [
        _export.ExportCase(
            ops.rms_norm.default,
            "eps 1e-6",
            (_export.randn(4, 16, scale=1e-3), _export.randn(16)),
            lambda x, w: ops.rms_norm(x, w, 1e-6),
        )
    ]
    with pytest.raises(AssertionError, match="rms_norm"):
        export_and_compare(cases, table=wrong)


def check_an_op_without_a_table_entry_is_named(export) -> None:
    """``export(module, args)`` of a model calling an op the table lacks
    (causal_conv1d_update, which updates its state in place) raises an error
    naming the op's overload."""

    class ConvStep(torch.nn.Module):
        def forward(self, x, state, w):
            return fuseops.causal_conv1d_update(x, state, w)

    args = (torch.randn(1, 4), torch.randn(1, 4, 2), torch.randn(4, 3))
    with (
        torch.no_grad(),
        pytest.raises(
            NotImplementedError, match=r"torch\.ops\.fuseops\.causal_conv1d_update\.default"
        ),
    ):
        export(ConvStep(), args)


def fuseops_overloads() -> list:
    """Every overload of every op registered in the fuseops namespace."""
    found = []
    for schema in torch._C._jit_get_all_schemas():
        namespace, name = schema.name.split("::", 1)
        if namespace == "fuseops":
            packet = getattr(torch.ops.fuseops, name)
            found.append(getattr(packet, schema.overload_name or "default"))
    return sorted(found, key=str)


def check_complete(table, runs: str) -> None:
    """Every fuseops overload either is in ``table`` or has a reason to go
    without (its module's ``NOT_EXPORTED`` or a rule), never both; every
    value of ``table`` is callable."""
    overloads = fuseops_overloads()
    assert len(overloads) > 50 and torch.ops.fuseops.rms_norm.out in overloads, "ops not read"
    assert all(callable(function) for function in table.values())
    assert set(table) <= set(overloads), set(table) - set(overloads)
    modules = fuseops.ops.MODULES
    neither = [
        str(op) for op in overloads if op not in table and not _export.reason(modules, op, runs)
    ]
    both = [str(op) for op in table if _export.reason(modules, op, runs)]
    assert neither == [], f"without an export form or a reason: {neither}"
    assert both == [], f"exported, yet with a reason not to be: {both}"


class Logits(torch.nn.Module):
    """A causal LM's logits for input_ids, without the decode cache."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


def tiny_llama(quantize, **apply_kwargs):
    """``(Logits(model), input_ids, expected logits)`` of the tiny Llama of
    support/tiny_llama.py patched by ``fuseops.transformers.apply(model,
    quantize=quantize, **apply_kwargs)``; skips the test where transformers
    or the quantize mode is not installed."""
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (pip install 'fuseops[transformers]')"
    )
    import fuseops.transformers as fot

    from support import tiny_llama as config

    if quantize is not None and quantize not in fot.quantize_modes():
        pytest.skip(f"{quantize} is not built in this installation")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config.CONFIG)).eval()
    patched = {r.new.split(";")[0] for r in fot.apply(model, quantize=quantize, **apply_kwargs)}
    assert {"fuseops.rms_norm", "fuseops.rope", "fuseops.swiglu"} <= patched
    input_ids = torch.randint(0, config.VOCAB, (2, 12))
    wrapper = Logits(model)
    with torch.no_grad():
        expected = wrapper(input_ids)
    return wrapper, input_ids, expected


def check_bench_command(flag: str, suffix: str, title: str, variants: list, tmp_path) -> None:
    """``python -m fuseops bench --<flag>`` on the tiny model with
    `variants` (float32 first, then int8 ones): a row per variant with the
    program file's size (`suffix`) and both runtimes' times (`title`'s and
    PyTorch's); the int8 programs are the smaller, their logits PyTorch's
    (float32 rounding order apart); the JSON and text files hold the same."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fuseops",
            "bench",
            f"--{flag}",
            f"--{flag}-size",
            "tiny",
            f"--{flag}-variants",
            *variants,
            f"--{flag}-prompt",
            "8",
            f"--{flag}-repeats",
            "1",
            "--threads",
            "1",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    [columns] = [line for line in lines if line.startswith("| variant |")]
    assert [c.strip() for c in columns.strip("|").split("|")] == [
        "variant",
        f"{suffix} MiB",
        "vs float32",
        f"{title} ms",
        "PyTorch ms",
        "max abs diff",
    ]
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in lines
        if line.startswith("| ") and not line.startswith(("| variant", "| ---"))
    ]
    assert [r[0] for r in rows] == variants
    assert rows[0][2] == "1.00x"
    report = json.loads((tmp_path / f"{flag}.json").read_text())
    assert report["size"] == "tiny" and report["prompt_tokens"] == 8
    assert report["runtime"] == title
    float_row, *int8_rows = report["rows"]
    for row, variant in zip(report["rows"], variants):
        assert row["variant"] == variant
        path = tmp_path / f"llama-tiny-{variant}{suffix}"
        # An ONNX model may keep its weights in a data file beside it.
        data = tmp_path / f"llama-tiny-{variant}{suffix}.data"
        assert row["program_bytes"] == os.path.getsize(path) + (
            os.path.getsize(data) if data.exists() else 0
        )
        assert row["runtime_ms"] > 0 and row["pytorch_ms"] > 0
        # float32 logits of order 1: the graphs differ in rounding order only.
        assert row["max_abs_diff"] < 1e-4, row
    # The packed int8 weights, whichever computes them.
    for row in int8_rows:
        assert 0 < row["program_bytes"] < float_row["program_bytes"], row
    assert (tmp_path / f"{flag}.txt").read_text().strip() == result.stdout.split("\nwrote ")[0]


def check_bench_refuses_an_unknown_variant(flag: str, tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fuseops", "bench", f"--{flag}", f"--{flag}-variants", "w3a3"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert f"unknown --{flag}-variants ['w3a3']" in result.stderr
