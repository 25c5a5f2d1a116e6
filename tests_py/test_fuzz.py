"""Property-based fuzzing of every op, from each op's ``fuzz(d)``
(python/fuseops/ops/cases/_fuzz.py): nothing here names an op, so a new op
is fuzzed as soon as its cases module declares one.

test_fuzz_valid: random valid calls (shapes with zero-size and size-1
dimensions, every dtype, permuted, step-sliced and stride-0 expanded
layouts) in three value regimes. Normal and subnormal values must give the
float64 reference's results (``fuseops.reference.<op>`` on float64 copies of
the inputs, rounded to each result's dtype) and, in float64, its gradients
(autograd through the reference). Values laced with NaN, +-Inf and the
dtype's largest finite values must not crash: the call returns results of
the reference's shapes, which match it wherever the reference does not
depend on a laced element (the reference run once more with those elements
made NaN tells where), or it raises an error naming the op (quantization
refuses such rows). An input that requires grad must give an output that
requires grad, or the op refuses with "not differentiable".

test_fuzz_invalid: a valid call with one argument made invalid: a tensor
made None, given a dimension more or less, a size off by one, another dtype
or the meta device; a string made an unknown one; a number made negative,
NaN, infinite or huge. The op raises an exception naming it, or (the
argument was valid after all, e.g. an optional tensor left out, a weight of
another floating dtype) computes the reference's result.

test_fuzz_out_aliasing: the out= overload, where an op has one, with every
input of the call's dtype placed in one random "arena" buffer at random
offsets and layouts, so inputs overlap each other and out= overlaps them;
out= may also be an input, a fresh tensor to resize, a strided or expanded
tensor or one of another dtype. A call writes into out= what the
allocating op computes from the same inputs and leaves every arena element
no out= addresses unchanged, or raises an error naming the op and an out=
argument where the rule of cpp/ops/common/checks.h refuses (another dtype,
elements that overlap, two outputs sharing memory, a resize of an out= that
shares an input's memory), leaving the arena unchanged.

Tolerances, relative to max(1, largest |expected|) of each result: 1e-9 in
float64 (float64 math throughout); 1e-5 in float32 (a few float32 roundings
per element, row sums included); 2**-7 in bfloat16 and 2**-9 in float16 (one
rounding of the result, 2**-9 and 2**-11, times 4 for the float32 math
before it); integer results exactly (quantization's float32 math is the
reference's); float64 results of an op documented to compute in float32
(the int8 linear layers: the declaration sets ``d.math_dtype``) get
float32's. Gradients in float64: 1e-7 times sqrt(terms summed), as sums
over rows.

The run is derandomized: FUSEOPS_FUZZ_EXAMPLES calls per op module and test
(default 100: about 2500 cases, 25 s on two busy cores; the counts are
printed in the terminal summary). For deeper fuzzing set it
higher and FUSEOPS_FUZZ_RANDOM=1, which draws new calls on every run, e.g.
``FUSEOPS_FUZZ_EXAMPLES=2000 FUSEOPS_FUZZ_RANDOM=1 pytest tests_py/test_fuzz.py``.
A failure prints the shrunk call and the draws that made it.
"""

from __future__ import annotations

import collections
import copy
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuseops
from fuseops.ops.cases import op_name
from fuseops.ops.cases._fuzz import Draw

from support import sample_run

EXAMPLES = int(os.environ.get("FUSEOPS_FUZZ_EXAMPLES", "100"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=os.environ.get("FUSEOPS_FUZZ_RANDOM", "0") != "1",
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    print_blob=False,
)

TOL = {torch.float64: 1e-9, torch.float32: 1e-5, torch.bfloat16: 2**-7, torch.float16: 2**-9}
GRAD_TOL = 1e-7
ERRORS = (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError)

MODULES = [m for m in fuseops.ops.cases.MODULES if hasattr(m, "fuzz")]
COUNTS: collections.Counter = collections.Counter()


def module_id(module) -> str:
    return op_name(module)


class _CountsReport:
    """Prints the number of cases run in pytest's terminal summary (output
    of the tests themselves is captured)."""

    @staticmethod
    def pytest_terminal_summary(terminalreporter):
        if COUNTS:
            line = "fuzz cases run: " + ", ".join(f"{k} {v}" for k, v in sorted(COUNTS.items()))
            terminalreporter.write_line(line + f" ({sum(COUNTS.values())} in all)")


@pytest.fixture(scope="module", autouse=True)
def _report_counts(request):
    if not request.config.pluginmanager.is_registered(_CountsReport):
        request.config.pluginmanager.register(_CountsReport, "fuseops_fuzz_counts")


def test_every_op_module_declares_fuzz():
    assert [module_id(m) for m in MODULES] == [module_id(m) for m in fuseops.ops.MODULES]


def draw(data, regime=None) -> Draw:
    return Draw(lambda lo, hi: data.draw(st.integers(lo, hi)), regime=regime)


def reference_of(sample):
    return getattr(fuseops.reference, sample.name)


def names_op(message: str, sample) -> bool:
    return sample.name in message or sample.wrapper.__name__ in message


def laced(t: torch.Tensor) -> torch.Tensor:
    """Where a floating tensor holds NaN, Inf or a value beyond half the
    dtype's range."""
    return ~t.isfinite() | (t.abs() > torch.finfo(t.dtype).max / 2)


def widened(args, taint=False, grad=False) -> list:
    """float64 copies of the tensors among `args` (laced elements made NaN
    with `taint`; leaves that require grad where the original does, with
    `grad`); bool tensors (masks) stay as they are."""
    result = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.dtype != torch.bool:
            w = a.detach().double().clone()
            if taint and a.is_floating_point():
                w[laced(a.detach())] = math.nan
            a = w.requires_grad_(grad and a.requires_grad)
        result.append(a)
    return result


def assert_matches(got, want, context, skip=None, tol=None):
    assert len(got) == len(want), f"{context}: {len(got)} results, reference {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert tuple(g.shape) == tuple(w.shape), (
            f"{context}: result {i} shape {tuple(g.shape)}, reference {tuple(w.shape)}"
        )
        w = w.detach().to(g.dtype).double()
        rtol = (tol or TOL).get(g.dtype, 0.0)
        g = g.detach().double()
        if skip is not None:
            keep = ~skip[i]
            g, w = g[keep], w[keep]
        scale = max(1.0, w.abs().nan_to_num(posinf=0, neginf=0).max().item()) if w.numel() else 1.0
        torch.testing.assert_close(
            g,
            w,
            rtol=rtol,
            atol=rtol * scale,
            equal_nan=True,
            msg=lambda m: f"{context}: result {i}: {m}",
        )


def is_float64_only(args) -> bool:
    return all(
        a.dtype == torch.float64
        for a in args
        if isinstance(a, torch.Tensor) and a.is_floating_point()
    )


def tolerance(d):
    return {**TOL, torch.float64: TOL[torch.float32]} if d.math_dtype == torch.float32 else TOL


def check_valid(sample, d):
    regime, tol = d.regime, tolerance(d)
    args = list(sample.public_args)
    check_grads = regime == "normal" and is_float64_only(args)
    if not check_grads:
        args = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    originals = copy.deepcopy([a.detach() if isinstance(a, torch.Tensor) else a for a in args])
    context = f"{sample!r} ({regime} values)"
    try:
        result = sample.wrapper(*args)
    except ERRORS as error:
        if "not differentiable" in str(error) and names_op(str(error), sample):
            COUNTS["refused to record a gradient"] += 1
            return check_valid_detached(sample, context, tol)
        assert regime == "special" and names_op(str(error), sample), f"{context}: {error}"
        COUNTS["special values refused"] += 1
        return
    got = sample_run.as_tuple(result)
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    differentiable = [i for i, o in enumerate(got) if o.requires_grad]
    assert not leaves or differentiable, f"{context}: no output requires grad"
    originals = [
        o.requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else o
        for o, a in zip(originals, args)
    ]
    wide = widened(originals, grad=check_grads)
    want = sample_run.as_tuple(reference_of(sample)(*wide))
    skip = None
    if regime == "special":
        tainted = sample_run.as_tuple(reference_of(sample)(*widened(originals, taint=True)))
        skip = [t.isnan() for t in tainted]
    assert_matches(got, want, context, skip, tol)
    COUNTS[f"valid {regime}"] += 1
    if not check_grads or not leaves:
        return
    if any(want[i].isnan().any() for i in differentiable):
        # An undefined result (a mean over no target): its gradient is a
        # convention (fuseops and torch give 0, the reference's masks NaN).
        return
    generator = torch.Generator().manual_seed(0)
    upstream = [
        torch.randn(got[i].shape, generator=generator, dtype=torch.float64) for i in differentiable
    ]
    grads = torch.autograd.grad(
        [got[i] for i in differentiable], leaves, upstream, allow_unused=True
    )
    wide_leaves = [w for w in wide if isinstance(w, torch.Tensor) and w.requires_grad]
    wanted = torch.autograd.grad(
        [want[i] for i in differentiable], wide_leaves, upstream, allow_unused=True
    )
    largest = max(got[i].numel() for i in differentiable)
    for leaf, g, w in zip(leaves, grads, wanted):
        g = torch.zeros_like(leaf) if g is None else g
        w = torch.zeros_like(leaf) if w is None else w
        tol = GRAD_TOL * math.sqrt(max(1.0, largest / max(1, leaf.numel())))
        assert_matches((g,), (w,), f"{context}: gradient", tol={torch.float64: tol})
    COUNTS["float64 gradients"] += 1


def check_valid_detached(sample, context, tol):
    args = [a.detach() if isinstance(a, torch.Tensor) else a for a in sample.public_args]
    wide = widened(args)
    got = sample_run.as_tuple(sample.wrapper(*args))
    assert_matches(got, sample_run.as_tuple(reference_of(sample)(*wide)), context, tol=tol)


@pytest.mark.parametrize("module", MODULES, ids=module_id)
def test_fuzz_valid(module):
    @SETTINGS
    @given(st.data())
    def run(data):
        d = draw(data)
        check_valid(module.fuzz(d), d)

    run()


# --- invalid arguments --------------------------------------------------------

TENSOR_MUTATIONS = ("none", "more_dims", "fewer_dims", "size", "dtype", "meta")


def mutated(d, a):
    """`a` made (probably) invalid, and what was done."""
    if isinstance(a, torch.Tensor):
        how = d.choice(TENSOR_MUTATIONS)
        if how == "none":
            return None, how
        if how == "more_dims":
            return a.unsqueeze(d.int(0, a.dim())), how
        if how == "fewer_dims":
            return (
                a.select(d.int(0, a.dim() - 1), 0)
                if a.dim() and a.numel()
                else a.reshape(-1)[:1].squeeze()
            ), how
        if how == "size":
            if not a.dim():
                return a.reshape(1).expand(2), how
            shape = list(a.shape)
            dim = d.int(0, a.dim() - 1)
            # Never to 0 elements, which many ops take whatever the other sizes.
            shape[dim] = shape[dim] + 1 if shape[dim] <= 1 else shape[dim] + d.choice((-1, 1))
            return torch.zeros(shape, dtype=a.dtype), how
        if how == "dtype":
            return a.to(
                d.choice(
                    (
                        torch.float32,
                        torch.float64,
                        torch.bfloat16,
                        torch.int32,
                        torch.int8,
                        torch.bool,
                    )
                )
            ), how
        return a.to("meta"), how
    if isinstance(a, str):
        return d.choice(("bogus", "", "NONE", "Silu")), "string"
    if isinstance(a, float):
        return d.choice((-1.0, math.nan, math.inf, -math.inf, 1e300)), "number"
    return d.choice((-(10**6), 10**6, -(2**40))), "integer"


def mutable(a) -> bool:
    return isinstance(a, (torch.Tensor, str, float, int)) and not isinstance(a, bool)


def check_invalid(sample, d):
    args = [a.detach() if isinstance(a, torch.Tensor) else a for a in sample.public_args]
    positions = [i for i, a in enumerate(args) if mutable(a)]
    position = d.choice(positions)
    args[position], how = mutated(d, args[position])
    context = f"{sample!r} with argument {position} {how}: {args[position]!r}"
    originals = copy.deepcopy(args)
    try:
        result = sample.wrapper(*args)
    except ERRORS as error:
        assert names_op(str(error), sample), f"{context}: an error not naming the op: {error}"
        COUNTS["invalid refused"] += 1
        return
    got = sample_run.as_tuple(result)
    if any(t.device.type == "meta" for t in got):
        # Every tensor argument was on meta: the op's Meta kernel ran, as
        # PyTorch's own ops do there (test_conformance checks its shapes).
        assert all(t.device.type == "meta" for t in got), context
        COUNTS["invalid accepted, meta kernel"] += 1
        return
    try:
        want = sample_run.as_tuple(reference_of(sample)(*widened(originals)))
    except Exception as error:  # noqa: BLE001 (any refusal by the reference)
        raise AssertionError(f"{context}: accepted where the reference refuses ({error})") from None
    assert_matches(got, want, context, tol=tolerance(d))
    COUNTS["invalid accepted, correct"] += 1


@pytest.mark.parametrize("module", MODULES, ids=module_id)
def test_fuzz_invalid(module):
    @SETTINGS
    @given(st.data())
    def run(data):
        d = draw(data, regime="normal")
        check_invalid(module.fuzz(d), d)

    run()


# --- out= aliasing ---------------------------------------------------------------


def out_overload(op):
    name = "out" if op._overloadname == "default" else op._overloadname + "_out"
    return getattr(op.overloadpacket, name, None)


def out_names(op) -> list:
    return [
        a.name
        for a in op._schema.arguments
        if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
    ]


def extent(shape, strides):
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, strides))


def random_layout(d, shape):
    """Strides of a permuted, possibly strided (step 2) layout of `shape`:
    distinct elements, as every layout PyTorch makes without as_strided."""
    order = list(range(len(shape)))
    for i in range(len(order) - 1, 0, -1):  # a drawn permutation, innermost last
        j = d.int(0, i)
        order[i], order[j] = order[j], order[i]
    strides, step = [0] * len(shape), 1
    for dim in reversed(order):
        stride_step = d.choice((1, 1, 1, 2))
        strides[dim] = step * stride_step
        step *= max(shape[dim], 1) * stride_step
    return strides


def same_storage(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def storage_span(t):
    if t.numel() == 0:
        return (0, 0)
    return t.storage_offset(), t.storage_offset() + extent(t.shape, t.stride())


def spans_intersect(a, b):
    (a0, a1), (b0, b1) = storage_span(a), storage_span(b)
    return a0 < b1 and b0 < a1


OUT_MODES = (
    "fresh",
    "fresh_resize",
    "fresh_strided",
    "other_dtype",
    "expanded",
    "input",
    "arena",
    "arena",
    "arena",
)


def make_out(d, arena, inputs, shape, dtype, window):
    mode = d.choice(OUT_MODES)
    if mode == "fresh":
        return torch.full(shape, math.nan, dtype=dtype)
    if mode == "fresh_resize":
        return torch.empty(d.int(0, 2), dtype=dtype)
    if mode == "fresh_strided":
        strides = random_layout(d, shape)
        return torch.full((max(extent(shape, strides), 1),), math.nan, dtype=dtype).as_strided(
            shape, strides
        )
    if mode == "other_dtype":
        return torch.empty(shape, dtype=torch.float64 if dtype != torch.float64 else torch.float32)
    if mode == "expanded" and len(shape) and shape[0] >= 2 and 0 not in shape:
        return torch.empty((1,) + tuple(shape[1:]), dtype=dtype).expand(shape)
    if mode == "input" and inputs:
        return d.choice(inputs)
    return arena.as_strided(shape, random_layout(d, shape), d.int(0, window))


def allowed_refusal(out_shapes, out_dtypes, inputs, outs) -> list:
    """The out= arguments the rule of cpp/ops/common/checks.h refuses here."""
    reasons = []
    for name, out in outs.items():
        if out.dtype != out_dtypes[name]:
            reasons.append(name)
        if any(st == 0 and s > 1 for s, st in zip(out.shape, out.stride())):
            reasons.append(name)
        if tuple(out.shape) != tuple(out_shapes[name]) and any(
            same_storage(out, t) for t in inputs
        ):
            reasons.append(name)
    names = list(outs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if outs[a] is outs[b] or (
                outs[a].numel()
                and outs[b].numel()
                and same_storage(outs[a], outs[b])
                and spans_intersect(outs[a], outs[b])
            ):
                reasons += [a, b]
    return reasons


def bits(t):
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).clone()


def check_out_aliasing(sample, d) -> bool:
    out_op = out_overload(sample.op)
    if out_op is None:
        return False
    args = [a.detach() if isinstance(a, torch.Tensor) else a for a in sample.args]
    floating = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    if not floating:
        return False
    dtype = floating[0].dtype
    placed = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.dtype == dtype]
    reference_results = sample_run.as_tuple(sample.op(*args))
    names = out_names(out_op)
    out_shapes = {n: tuple(r.shape) for n, r in zip(names, reference_results)}
    # An output of another dtype than the inputs (rms_norm's weight gradient
    # with a weight of its own dtype) is its own tensor, outside the arena.
    out_dtypes = {n: r.dtype for n, r in zip(names, reference_results)}
    shapes = [tuple(args[i].shape) for i in placed] + list(out_shapes.values())
    window = sum(math.prod(s) for s in shapes) + 4
    size = window + max(math.prod(2 * max(s, 1) for s in shape) for shape in shapes)
    gen = torch.Generator().manual_seed(d.int(0, 2**31 - 1))
    arena = torch.randn(size + window, generator=gen, dtype=torch.float64).to(dtype)
    for i in placed:
        view = arena.as_strided(args[i].shape, random_layout(d, args[i].shape), d.int(0, window))
        args[i] = view
    inputs = [args[i] for i in placed]
    outs = {
        n: make_out(d, arena, inputs, out_shapes[n], dtype, window)
        if out_dtypes[n] == dtype
        else torch.empty(out_shapes[n], dtype=out_dtypes[n])
        for n in names
    }
    expected = sample_run.as_tuple(sample.op(*args))
    before = bits(arena)
    refusable = allowed_refusal(out_shapes, out_dtypes, inputs, outs)
    context = f"{out_op} on {sample!r}: " + ", ".join(
        f"{n} {tuple(o.shape)}/{o.stride()}@{o.storage_offset()}{' (arena)' if same_storage(o, arena) else ''}"
        for n, o in outs.items()
    )
    try:
        out_op(*args, **outs)
    except RuntimeError as error:
        message = str(error).splitlines()[0]
        assert str(out_op._schema.name) in message and any(
            f"'{n}'" in message for n in refusable
        ), f"{context}: {message}"
        assert torch.equal(bits(arena), before), f"{context}: refused after writing"
        COUNTS["out= refused"] += 1
        return True
    written = torch.zeros(arena.numel(), dtype=torch.bool)
    for name, want in zip(names, expected):
        out = outs[name]
        assert out.dtype == out_dtypes[name], f"{context}: {name} of dtype {out.dtype} accepted"
        assert_matches((out,), (want,), f"{context}: {name}", tol=tolerance(d))
        if same_storage(out, arena) and out.numel():
            written.as_strided(out.shape, out.stride(), out.storage_offset()).fill_(True)
    assert torch.equal(bits(arena)[~written], before[~written]), f"{context}: wrote outside out="
    COUNTS["out= aliasing"] += 1
    return True


@pytest.mark.parametrize("module", MODULES, ids=module_id)
def test_fuzz_out_aliasing(module):
    found = []

    @SETTINGS
    @given(st.data())
    def run(data):
        d = draw(data, regime="normal")
        found.append(check_out_aliasing(module.fuzz(d), d))

    run()
    # A module whose ops have out= overloads must have drawn some (in a run
    # long enough to).
    has_out = any(out_overload(s.op) is not None for s in module.samples("cpu"))
    assert any(found) or not has_out or EXAMPLES < 20
