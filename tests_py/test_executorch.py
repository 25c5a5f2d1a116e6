"""fuseops.executorch: models calling fuseops ops exported to ExecuTorch
programs (the fuseops ops decomposed into core ATen operators, lowered with
the XNNPACK partitioner), run by ExecuTorch's Python runtime and compared
with the fuseops ops themselves.

Each op is exported once, in one module that calls it on every case (shapes,
dtypes, options) of that op, the cases' tensors being the program's inputs.

Tolerances. Both sides compute in float32 (float64 for float64 inputs) and
round once to the input's dtype; they differ only in the order of float32
operations (row sums, matrix products, fused multiply-adds, erf/tanh/exp
implementations), a few float32 ulps. So:

- float32 (and float64, whose decompositions do the op's float64 math):
  rtol 2e-6, atol 2e-6 times the largest magnitude of the case's expected
  result (1e-5 for the float matrix products of the weight-only linears,
  whose sums over K run in another order and, for int4, apply the group
  scales to the weight instead of to each group's sum);
- bfloat16 and float16: the float32 results round to the same value but
  where they straddle a rounding boundary, one unit in the last place
  apart: rtol the dtype's epsilon (7.8e-3, 9.8e-4), atol that epsilon times
  1e-3 of the largest magnitude (values near 0).
- the dynamic (int8-activation) linears quantize the activations with the
  same float32 operations as the op, so the integer sums are equal and only
  the float32 epilogue's order differs: as float32 above.

A mismatch of the math (a wrong epsilon, a scale not applied, the pairs of
the other rope layout, the wrong half of a packed input) is orders of
magnitude above these bounds; test_a_wrong_decomposition_fails checks that
the comparison catches one.
"""

from __future__ import annotations

import itertools
import os
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

from fuseops.ops.activation import SPECIAL_VALUES  # noqa: E402
from fuseops.ops.rope import rope_cache  # noqa: E402

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
F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
HALF = (F16, BF16)


# --- running an exported program ------------------------------------------------


def run_pte(program, inputs) -> list[torch.Tensor]:
    """The outputs of `program` (an ExecutorchProgramManager) run by
    ExecuTorch's runtime on `inputs`."""
    method = Runtime.get().load_program(program.buffer).load_method("forward")
    return list(method.execute([t.contiguous() for t in inputs]))


class Calls(torch.nn.Module):
    """Calls each case's function on its tensors (the module's inputs, in
    order) and returns every result, flattened."""

    def __init__(self, cases):
        super().__init__()
        self.cases = cases

    def forward(self, *inputs):
        results, i = [], 0
        for case in self.cases:
            args = inputs[i : i + len(case.args)]
            i += len(case.args)
            out = case.fn(*args)
            results += list(out) if isinstance(out, (tuple, list)) else [out]
        return tuple(results)


class Case:
    def __init__(self, label, fn, *args, rtol=None, atol=None):
        self.label, self.fn, self.args = label, fn, args
        self.rtol, self.atol = rtol, atol


def _bounds(case: Case, expected: torch.Tensor) -> tuple[float, float]:
    finite = expected[expected.isfinite()].double().abs()
    largest = finite.max().item() if finite.numel() else 1.0
    if expected.dtype in HALF:
        eps = torch.finfo(expected.dtype).eps
        rtol, atol = eps, eps * 1e-3 * largest
    else:
        rtol, atol = 2e-6, 2e-6 * largest
    return max(rtol, case.rtol or 0.0), max(atol, (case.atol or 0.0) * largest)


def export_and_compare(cases, table=None):
    """Exports one module calling every case, runs it in ExecuTorch's runtime
    and compares each output with the eager fuseops result."""
    kwargs = {} if table is None else {"decomposition_table": table}
    inputs = [t for case in cases for t in case.args]
    with torch.no_grad():
        model = Calls(cases).eval()
        expected = model(*inputs)
        program = fet.export(model, tuple(inputs), **kwargs)
    got = run_pte(program, inputs)
    assert len(got) == len(expected)
    owners = []
    for case in cases:
        with torch.no_grad():
            out = case.fn(*case.args)
        owners += [case] * (len(out) if isinstance(out, (tuple, list)) else 1)
    for i, (case, g, e) in enumerate(zip(owners, got, expected)):
        label = f"{case.label} (output {i})"
        assert g.dtype == e.dtype and g.shape == e.shape, f"{label}: {g.dtype}{tuple(g.shape)}"
        rtol, atol = _bounds(case, e)
        torch.testing.assert_close(
            g, e, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{label}: {m}"
        )
    return program


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


# --- the cases -------------------------------------------------------------------


def t(*shape, dtype=F32, scale=1.0):
    return (torch.randn(*shape) * scale).to(dtype)


CASES = {}


def case(name):
    def register(fn):
        CASES[name] = fn
        return fn

    return register


ALL = (F32, F16, BF16, F64)


@case("rms_norm")
def _():
    return (
        [
            Case(f"{dtype} weight", ops.rms_norm, t(5, 24, dtype=dtype), t(24, dtype=dtype))
            for dtype in ALL
        ]
        + [
            # eps=None: the machine epsilon of float32 (of float64 for float64).
            Case(
                f"{dtype} 3-d, no weight, eps=None",
                lambda x: ops.rms_norm(x, None, None),
                t(2, 3, 40, dtype=dtype, scale=1e-4),
            )
            for dtype in (F32, F64)
        ]
        + [
            # A float32 weight on any x; eps large enough to matter.
            Case(
                f"{dtype} float32 weight, eps=0.5",
                lambda x, w: ops.rms_norm(x, w, 0.5),
                t(3, 7, dtype=dtype, scale=0.3),
                t(7),
            )
            for dtype in (F32, BF16)
        ]
    )


@case("fused_add_rms_norm")
def _():
    return [
        Case(
            f"{dtype} {shape}",
            lambda x, r, w: ops.fused_add_rms_norm(x, r, w, 1e-6),
            t(*shape, dtype=dtype),
            t(*shape, dtype=dtype),
            t(shape[-1], dtype=dtype),
        )
        for dtype, shape in zip(ALL, ((5, 24), (2, 3, 33), (5, 24), (2, 3, 33)))
    ] + [
        Case(
            "no weight, eps=None",
            lambda x, r: ops.fused_add_rms_norm(x, r, None, None),
            t(4, 16),
            t(4, 16),
        )
    ]


@case("layer_norm")
def _():
    return [
        Case(
            f"{dtype} weight and bias",
            lambda x, w, b: ops.layer_norm(x, w, b, 1e-5),
            t(5, 24, dtype=dtype, scale=3.0),
            t(24, dtype=dtype),
            t(24, dtype=dtype),
        )
        for dtype in ALL
    ] + [
        Case(
            "float32 3-d, neither, eps=0.5",
            lambda x: ops.layer_norm(x, None, None, 0.5),
            t(2, 3, 40),
        ),
        Case(
            "float16 bias only",
            lambda x, b: ops.layer_norm(x, None, b, 1e-6),
            t(3, 9, dtype=F16) + 5,
            t(9, dtype=F16),
        ),
    ]


def _elementwise_cases(fn, dtypes=ALL):
    special = torch.tensor(SPECIAL_VALUES)
    return [
        Case(f"{dtype} (2, 3, 16)", fn, t(2, 3, 16, dtype=dtype, scale=3.0)) for dtype in dtypes
    ] + [Case(f"{dtype} special values", fn, special.to(dtype)) for dtype in dtypes]


@case("gelu")
def _():
    return _elementwise_cases(lambda x: ops.gelu(x, "none")) + _elementwise_cases(
        lambda x: ops.gelu(x, "tanh"), (F32, BF16)
    )


@case("silu")
def _():
    return _elementwise_cases(ops.silu)


@case("relu")
def _():
    return _elementwise_cases(ops.relu)


@case("bias_gelu")
def _():
    return [
        Case(
            f"{dtype} {approximate} {shape}",
            lambda x, b, a=approximate: ops.bias_gelu(x, b, a),
            t(*shape, dtype=dtype, scale=3.0),
            t(shape[-1], dtype=dtype),
        )
        for approximate in ("none", "tanh")
        for dtype, shape in zip(ALL, ((5, 24), (2, 3, 17), (5, 24), (2, 3, 17)))
    ]


def _gated_cases(op, approximates, dtypes=ALL):
    cases = []
    for dtype, a in itertools.product(dtypes, approximates):
        extra = () if a is None else (a,)
        cases += [
            Case(
                f"{dtype} {a} (5, 24)",
                lambda g, u, extra=extra: op(g, u, *extra),
                t(5, 24, dtype=dtype, scale=3.0),
                t(5, 24, dtype=dtype),
            ),
            Case(
                f"{dtype} {a} packed (2, 3, 17)",
                lambda x, extra=extra: op.packed(x, *extra),
                t(2, 3, 34, dtype=dtype, scale=3.0),
            ),
        ]
    return cases


@case("swiglu")
def _():
    return _gated_cases(ops.swiglu, (None,))


@case("geglu")
def _():
    # Each dtype in both forms with erf; tanh in float32 and float16.
    return _gated_cases(ops.geglu, ("none",)) + _gated_cases(ops.geglu, ("tanh",), (F32, F16))


@case("rope")
def _():
    cos, sin = rope_cache(16, 32)
    cos_i, sin_i = rope_cache(8, 32, interleaved=True)
    positions = torch.tensor([3, 0, 31, 7, 7])
    batch_positions = torch.tensor([[0, 1, 2], [5, 9, 30]], dtype=torch.int32)
    # NeoX/Llama pairs, full rotary, a cache and positions, GQA.
    cases = [
        Case(
            f"{dtype} neox positions",
            lambda q, k, c, s, p: ops.rope(q, k, c, s, p, False),
            t(5, 4, 16, dtype=dtype),
            t(5, 2, 16, dtype=dtype),
            cos,
            sin,
            positions,
        )
        for dtype in ALL
    ]
    for dtype in (F32, BF16):
        cases += [
            # GPT-J pairs on the first 8 of 16 dims, positions [batch, seq] int32.
            Case(
                f"{dtype} gptj partial, int32 positions [batch, seq]",
                lambda q, k, c, s, p: ops.rope(q, k, c, s, p, True),
                t(2, 3, 4, 16, dtype=dtype),
                t(2, 3, 1, 16, dtype=dtype),
                cos_i,
                sin_i,
                batch_positions,
            ),
            # One row per token (Hugging Face's position_embeddings), a
            # cache in x's dtype, no key.
            Case(
                f"{dtype} per-token rows, single",
                lambda x, c, s: ops.rope.single(x, c, s, None, False),
                t(2, 3, 4, 16, dtype=dtype),
                cos[batch_positions.long()].to(dtype),
                sin[batch_positions.long()].to(dtype),
            ),
            # cos/sin rows of any values (not a rotation), partial rotary.
            Case(
                f"{dtype} arbitrary rows, partial, single",
                lambda x, c, s, p: ops.rope.single(x, c, s, p, False),
                t(5, 2, 24, dtype=dtype),
                t(9, 12),
                t(9, 12),
                torch.tensor([8, 0, 1, 4, 4]),
            ),
        ]
    return cases


def _int8_weight(n, k):
    w = torch.randn(n, k) * 0.05
    return fuseops.pack_int8_weight(*fuseops.quantize_per_channel_int8(w))


@case("int8_weight_only_linear")
def _():
    cases = []
    for i, dtype in enumerate(ALL):
        (m, n, k), bias = ((3, 20, 37), (1, 16, 64))[i % 2], i < 2
        packed, scale, _ = _int8_weight(n, k)
        args = (t(2, m, k, dtype=dtype), packed, scale) + ((t(n, dtype=dtype),) if bias else ())
        cases.append(
            Case(
                f"{dtype} {m}x{k} @ {n} bias={bias}",
                ops.int8_weight_only_linear,
                *args,
                rtol=1e-5,
                atol=1e-5,
            )
        )
    return cases


@case("int8_dynamic_linear")
def _():
    cases = []
    for i, dtype in enumerate(ALL):
        (m, n, k), bias = ((3, 20, 37), (1, 16, 64))[i % 2], i < 2
        args = (t(2, m, k, dtype=dtype), *_int8_weight(n, k)) + (
            (t(n, dtype=dtype),) if bias else ()
        )
        cases.append(Case(f"{dtype} {m}x{k} @ {n} bias={bias}", ops.int8_dynamic_linear, *args))
    # A row of zeros (scale 1), a row holding Inf and one holding NaN (NaN rows).
    x = t(4, 32)
    x[1] = 0
    x[2, 5] = float("inf")
    x[3, 0] = float("nan")
    cases.append(Case("zero, Inf and NaN rows", ops.int8_dynamic_linear, x, *_int8_weight(8, 32)))
    return cases


def _int4_weight(n, k, group_size, symmetric):
    w = torch.randn(n, k) * 0.05
    wq, scale, zero = fuseops.quantize_per_group_int4(w, group_size, symmetric)
    return fuseops.pack_int4_weight(wq, scale, zero, group_size)


def _int4_cases(op, **tolerance):
    # float32 with each shape (K a multiple of the group size or not, N a
    # multiple of 16 or not), the other dtypes with one each; symmetric and
    # asymmetric weights, with and without bias, in turn.
    cases = []
    shapes = ((3, 20, 64, 32), (1, 17, 72, 32), (2, 16, 128, 128))
    combos = [(F32, shape) for shape in shapes] + list(zip((F16, BF16, F64), shapes))
    for i, (dtype, (m, n, k, group_size)) in enumerate(combos):
        symmetric, bias = i % 2 == 0, i % 4 < 2
        packed, scale_zero = _int4_weight(n, k, group_size, symmetric)
        args = (t(2, m, k, dtype=dtype), packed, scale_zero)
        fn = (
            (lambda x, p, sz, b, g=group_size: op(x, p, sz, g, b))
            if bias
            else (lambda x, p, sz, g=group_size: op(x, p, sz, g, None))
        )
        label = f"{dtype} {m}x{k} @ {n} group {group_size} symmetric={symmetric} bias={bias}"
        cases.append(Case(label, fn, *args, *((t(n, dtype=dtype),) if bias else ()), **tolerance))
    return cases


@case("int4_weight_only_linear")
def _():
    return _int4_cases(ops.int4_weight_only_linear, rtol=1e-5, atol=1e-5)


@case("int4_dynamic_linear")
def _():
    # A row of zeros, a row holding Inf and one holding NaN (NaN rows).
    x = t(4, 64)
    x[1] = 0
    x[2, 5] = float("-inf")
    x[3, 0] = float("nan")
    rows = Case(
        "zero, Inf and NaN rows",
        lambda x, p, sz: ops.int4_dynamic_linear(x, p, sz, 32, None),
        x,
        *_int4_weight(8, 64, 32, True),
    )
    return _int4_cases(ops.int4_dynamic_linear) + [rows]


@case("decode_attention")
def _():
    cases = []
    for dtype in ALL:
        cases.append(
            Case(
                f"{dtype} 8/2 heads, one new token",
                lambda q, k, v: ops.decode_attention(q, k, v),
                t(2, 8, 1, 16, dtype=dtype),
                t(2, 2, 20, 16, dtype=dtype),
                t(2, 2, 20, 16, dtype=dtype),
            )
        )
    mask = torch.rand(1, 1, 3, 9) > 0.3
    mask[..., 0, :] = False  # a row that sees no key: zeros
    bias = torch.randn(1, 4, 3, 9).masked_fill(~mask, float("-inf"))
    cases += [
        Case(
            "bool mask, softcap, scale",
            lambda q, k, v, m: ops.decode_attention(q, k, v, m, False, 0.4, 2.0),
            t(1, 4, 3, 8),
            t(1, 2, 9, 8),
            t(1, 2, 9, 6),
            mask,
        ),
        Case(
            "additive mask and causal",
            lambda q, k, v, m: ops.decode_attention(q, k, v, m, True),
            t(1, 4, 3, 8),
            t(1, 1, 9, 8),
            t(1, 1, 9, 8),
            bias,
        ),
    ]
    return cases


# --- the tests -------------------------------------------------------------------

#: The ops this slice decomposes, each with the overloads an inference graph
#: calls.
DECOMPOSED = {
    "rms_norm": ("default",),
    "fused_add_rms_norm": ("default",),
    "layer_norm": ("default",),
    "rope": ("default", "single"),
    "swiglu": ("default", "packed"),
    "geglu": ("default", "packed"),
    "gelu": ("default",),
    "silu": ("default",),
    "relu": ("default",),
    "bias_gelu": ("default",),
    "int8_weight_only_linear": ("default",),
    "int8_dynamic_linear": ("default",),
    "int4_weight_only_linear": ("default",),
    "int4_dynamic_linear": ("default",),
    "decode_attention": ("default",),
}


def test_the_table_covers_the_inference_ops():
    table = fet.decomposition_table()
    expected = {
        getattr(getattr(ops, name), overload)
        for name, overloads in DECOMPOSED.items()
        for overload in overloads
    }
    assert expected <= set(table)
    assert all(callable(fn) for fn in table.values())
    # Every decomposed op is tested below.
    assert {key.name().split("::")[1].split(".")[0] for key in table} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_runs_in_executorch_as_fuseops(name):
    torch.manual_seed(0)
    program = export_and_compare(CASES[name]())
    assert not fuseops_ops_left(program)


def test_a_wrong_decomposition_fails():
    """The comparison catches a decomposition that gets the math slightly
    wrong: rms_norm with eps 1e-5 where the op has 1e-6."""
    wrong = {ops.rms_norm.default: lambda x, w=None, eps=None: fet.rms_norm(x, w, 1e-5)}
    cases = [Case("rms_norm", lambda x, w: ops.rms_norm(x, w, 1e-6), t(4, 16, scale=1e-3), t(16))]
    with pytest.raises(AssertionError, match="rms_norm"):
        export_and_compare(cases, table=wrong)


def test_an_op_without_a_decomposition_is_named():
    class Conv(torch.nn.Module):
        def forward(self, x, w):
            return fuseops.causal_conv1d(x, w)

    with pytest.raises(NotImplementedError, match=r"torch\.ops\.fuseops\.causal_conv1d\.default"):
        fet.export(Conv(), (torch.randn(1, 4, 8), torch.randn(4, 3)))


def test_plain_lowering_fails_without_the_decompositions():
    """What fuseops.executorch is for: ExecuTorch itself cannot lower a
    graph calling a fuseops op."""
    from executorch.exir import to_edge_transform_and_lower

    class Norm(torch.nn.Module):
        def forward(self, x):
            return fuseops.rms_norm(x)

    x = t(3, 16)
    program = torch.export.export(Norm(), (x,), strict=False)
    with pytest.raises(Exception, match=r"fuseops::rms_norm"):
        to_edge_transform_and_lower(program).to_executorch()
    # fuseops.executorch.export takes the ExportedProgram as it is.
    (y,) = run_pte(fet.export(program, partitioner=[]), [x])
    torch.testing.assert_close(y, fuseops.rms_norm(x), rtol=2e-6, atol=2e-6)


class Logits(torch.nn.Module):
    """A causal LM's logits for input_ids, without the decode cache."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


def _export_tiny_llama(quantize, path):
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (pip install 'fuseops[transformers]')"
    )
    import fuseops.transformers as fot

    from support import tiny_llama

    if quantize is not None and quantize not in fot.quantize_modes():
        pytest.skip(f"{quantize} is not built in this installation")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**tiny_llama.CONFIG)).eval()
    patched = {r.new for r in fot.apply(model, quantize=quantize)}
    assert {"fuseops.rms_norm", "fuseops.rope", "fuseops.swiglu"} <= patched
    input_ids = torch.randint(0, tiny_llama.VOCAB, (2, 12))
    with torch.no_grad():
        wrapper = Logits(model)
        expected = wrapper(input_ids)
        program = fet.export(wrapper, (input_ids,), path)
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
