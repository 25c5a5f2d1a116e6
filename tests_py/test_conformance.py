"""One conformance suite for every fuseops op, on every device.

Each op module's ``samples(device)`` (fuseops/ops/<module>.py) feeds the same
checks: torch.library.opcheck on every overload (out= and backward ops
included), the Meta kernel and FakeTensor against the real op, the pybind
module against torch.ops (autograd through the C++ API included), out=
semantics, torch.compile(fullgraph=True) forward and backward, torch.export,
torch.jit.trace, the profiler, and every CPU build this CPU runs. A new op's
samples are found with its module: nothing here names an op. The op files
(test_<op>.py) hold the numerics.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map

import fuseops
import fuseops.ops.cases
from support import sample_run
from support.cpu_builds import CAPABILITY_ORDER, run_under_cpu_capability
from support.errors import expect_error_mentions
from support.params import DEVICES


def _all_samples() -> dict:
    # Seeded here, so that every run (and every CPU build's child process,
    # which gets these very tensors) sees the same inputs.
    cuda = list(range(torch.cuda.device_count()))
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(0)
        return {device: fuseops.ops.cases.samples(device) for device in DEVICES}


SAMPLES = _all_samples()


def _params(select=lambda sample: True, first_per_op=False):
    """pytest params over (device, sample) of the samples `select` keeps;
    with `first_per_op`, only the first kept sample of each overload."""
    params = []
    for device, samples in SAMPLES.items():
        seen = set()
        for index, sample in enumerate(samples):
            if sample.large or not select(sample):
                continue
            if first_per_op and sample.op in seen:
                continue
            seen.add(sample.op)
            params.append(pytest.param(sample, id=f"{device}-{sample.op}-{index}"))
    return params


def is_out(sample) -> bool:
    return sample.overload == "out" or sample.overload.endswith("_out")


def is_backward_op(sample) -> bool:
    return sample.name.endswith("_backward")


def needs_grad(sample) -> bool:
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in sample.args)


def fresh(sample):
    """Copies of (args, kwargs, public_args): tests write into out= tensors,
    and views of one tensor stay views of one copy."""
    return copy.deepcopy((sample.args, sample.kwargs, sample.public_args))


def detached(values):
    return tree_map(lambda a: a.detach() if isinstance(a, torch.Tensor) else a, values)


def outputs(result, kwargs) -> tuple:
    """What a call computed: the out= tensors of an out overload (which
    returns nothing), otherwise its returned tensors."""
    return tuple(kwargs.values()) if kwargs else sample_run.as_tuple(result)


def assert_identical(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.dtype == e.dtype and a.device == e.device
        torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True)


def tensor_call(sample, public_args):
    """A function of the sample's tensors alone (None, numbers and strings
    baked in), calling its public wrapper, and those tensors."""
    positions = [i for i, a in enumerate(public_args) if isinstance(a, torch.Tensor)]
    # An op that writes into an input that is not an out= tensor
    # (cross_entropy_inplace) gets copies, so that calling it twice on the
    # same tensors gives the same results.
    mutates = any(
        a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only
        for a in sample.op._schema.arguments
    )

    def call(*tensors):
        if mutates:
            tensors = [t.clone() for t in tensors]
        args = list(public_args)
        for i, t in zip(positions, tensors):
            args[i] = t
        return sample.wrapper(*args)

    return call, tuple(public_args[i] for i in positions)


# --- coverage -------------------------------------------------------------------


def _overload_name(op) -> str:
    return op._schema.name + ("" if op._overloadname == "default" else f".{op._overloadname}")


def test_every_registered_overload_has_samples_and_a_wrapper():
    registered = {n for n in torch._C._dispatch_get_all_op_names() if n.startswith("fuseops::")}
    for device, samples in SAMPLES.items():
        assert {_overload_name(s.op) for s in samples} == registered, device
    for module in fuseops.ops.MODULES:
        for name in module.__all__:
            assert name in fuseops.__all__ and getattr(fuseops, name) is getattr(module, name)
    assert {s.wrapper.__name__ for s in SAMPLES["cpu"]} <= set(fuseops.__all__)


# --- opcheck -------------------------------------------------------------------


@pytest.mark.parametrize("sample", _params())
def test_opcheck(sample):
    args, kwargs, _ = fresh(sample)
    torch.library.opcheck(sample.op, args, kwargs)


# --- Meta kernels and FakeTensor ---------------------------------------------


@pytest.mark.parametrize("sample", _params())
def test_meta_and_fake_tensors_match_the_real_op(sample):
    args, kwargs, _ = detached(fresh(sample))
    real = outputs(sample.op(*args, **kwargs), kwargs)

    def to_meta(a):
        if not isinstance(a, torch.Tensor):
            return a
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")

    meta_args, meta_kwargs = tree_map(to_meta, (args, kwargs))
    meta = outputs(sample.op(*meta_args, **meta_kwargs), meta_kwargs)
    with FakeTensorMode() as mode:
        fake_args, fake_kwargs = tree_map(
            lambda a: mode.from_tensor(a) if isinstance(a, torch.Tensor) else a, (args, kwargs)
        )
        fake = outputs(sample.op(*fake_args, **fake_kwargs), fake_kwargs)
    assert len(meta) == len(fake) == len(real)
    for r, m, f in zip(real, meta, fake):
        assert m.device.type == "meta"
        assert (m.shape, m.dtype, m.stride()) == (r.shape, r.dtype, r.stride())
        assert (f.shape, f.dtype, f.stride(), f.device) == (r.shape, r.dtype, r.stride(), r.device)


# --- the pybind module (the C++ API) against torch.ops -------------------------


def pybind_name(sample) -> str:
    """The C++ API function of an overload, as python/csrc binds it:
    ``<op>``, ``<op>_<overload>``, and for backward ops
    ``<forward>_<overload>_backward`` (``swiglu_packed_backward``) but
    ``<op>_<overload>`` for their out= overloads (``relu_backward_out``)."""
    suffix = "" if sample.overload == "default" else f"_{sample.overload}"
    if is_backward_op(sample) and not sample.kwargs:
        return sample.name[: -len("_backward")] + suffix + "_backward"
    return sample.name + suffix


def _backward_samples() -> list:
    """One CPU sample of each backward op's functional overload, float64
    where the op has one (for gradcheck)."""
    chosen: dict = {}
    for sample in SAMPLES["cpu"]:
        if sample.large or sample.kwargs or not is_backward_op(sample):
            continue
        floats = [a for a in sample.args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        is_double = bool(floats) and all(a.dtype == torch.float64 for a in floats)
        if sample.op not in chosen or (is_double and not chosen[sample.op][1]):
            chosen[sample.op] = (sample, is_double)
    return [pytest.param(s, d, id=str(op)) for op, (s, d) in chosen.items()]


@pytest.mark.parametrize("sample, is_double", _backward_samples())
def test_backward_op_follows_the_double_backward_policy(sample, is_double):
    """cpp/ops/autograd/no_derivative.h: called on inputs that require grad
    with grad mode on, every backward op either records a derivative (then
    gradcheck holds in float64) or raises at once naming itself; it never
    returns a result whose gradient would silently be None. Found from the
    samples: no list of backward ops to keep."""
    args, _, _ = fresh(sample)
    args = [
        a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
        for a in args
    ]
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    try:
        result = sample.op(*args)
    except RuntimeError:
        expect_error_mentions(lambda: sample.op(*args), [sample.name, "not differentiable"])
        with torch.no_grad():
            sample.op(*args)
        return
    outputs = [t for t in sample_run.as_tuple(result) if t.is_floating_point() and t.numel()]
    assert outputs and all(t.grad_fn is not None for t in outputs), (
        f"{sample.op} returned outputs without a derivative on inputs that require grad"
    )
    if is_double:
        assert torch.autograd.gradcheck(lambda *xs: sample.op(*_replaced(args, xs)), leaves)


def _replaced(args, tensors):
    """``args`` with its grad-requiring tensors replaced, in order, by ``tensors``."""
    it = iter(tensors)
    return [next(it) if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args]


@pytest.mark.parametrize("sample", _params())
def test_pybind_matches_torch_ops(sample):
    """Same results, and for samples that require grad the same gradients,
    which then come through the C++ API's own autograd."""
    cpp = getattr(fuseops._C, pybind_name(sample))
    args, kwargs, _ = fresh(sample)
    expected, grad_outputs = sample_run.run(sample.op, args, kwargs)
    args, kwargs, _ = fresh(sample)
    if kwargs:
        # The C++ API takes the out= tensors positionally, after the inputs.
        cpp(*args, *kwargs.values())
        actual = tuple(kwargs.values())
    else:
        actual, _ = sample_run.run(cpp, args, {}, grad_outputs)
    assert (grad_outputs is not None) == needs_grad(sample)
    assert_identical(actual, expected)


# --- out= ----------------------------------------------------------------------


def strided_like(t: torch.Tensor) -> torch.Tensor:
    """An empty tensor shaped like `t` whose elements are not contiguous."""
    if t.dim() >= 2:
        dims = tuple(reversed(range(t.dim())))
        return torch.empty(tuple(reversed(t.shape)), dtype=t.dtype, device=t.device).permute(dims)
    if t.dim() == 1:
        return torch.empty(2 * t.numel(), dtype=t.dtype, device=t.device)[::2]
    return torch.empty_like(t)


@pytest.mark.parametrize("sample", _params(is_out))
def test_out_semantics(sample):
    args, kwargs, public_args = fresh(sample)
    functional_name = "default" if sample.overload == "out" else sample.overload[: -len("_out")]
    expected = sample_run.as_tuple(getattr(sample.op.overloadpacket, functional_name)(*args))

    returned = sample_run.as_tuple(sample.wrapper(*public_args, **kwargs))
    assert len(returned) == len(kwargs)
    assert all(r is o for r, o in zip(returned, kwargs.values())), (
        "the wrapper returns its out= tensors"
    )
    assert_identical(returned, expected)

    strided = {name: strided_like(t) for name, t in kwargs.items()}
    layouts = {name: (t.data_ptr(), t.stride()) for name, t in strided.items()}
    sample.wrapper(*public_args, **strided)
    assert {name: (t.data_ptr(), t.stride()) for name, t in strided.items()} == layouts
    assert_identical(tuple(strided.values()), expected)

    empty = {name: t.new_empty(0) for name, t in kwargs.items()}
    sample.wrapper(*public_args, **empty)
    assert_identical(tuple(empty.values()), expected)

    wrong = dict(kwargs)
    first = next(iter(kwargs))  # `out`, or the first of several (grad_gate)
    other = torch.float32 if kwargs[first].dtype == torch.float64 else torch.float64
    wrong[first] = kwargs[first].to(other)
    expect_error_mentions(
        lambda: sample.wrapper(*public_args, **wrong),
        [f"{sample.op._schema.name}.{sample.overload}", f"'{first}'", "dtype"],
    )


# --- compilers ---------------------------------------------------------------


@pytest.mark.parametrize("sample", _params(lambda s: not is_out(s), first_per_op=True))
def test_torch_compile_fullgraph_forward(sample):
    torch._dynamo.reset()
    _, _, public_args = detached(fresh(sample))
    call, tensors = tensor_call(sample, public_args)

    def doubled(*inputs):
        # Doubling (exact, so results stay identical) gives Inductor code of
        # its own to generate around the op, which must stay one extern call:
        # fullgraph=True fails on any graph break.
        return [o * 2 for o in sample_run.as_tuple(call(*inputs))]

    compiled = torch.compile(doubled, fullgraph=True, backend="inductor")
    assert_identical(compiled(*tensors), doubled(*tensors))


@pytest.mark.parametrize(
    "sample",
    _params(lambda s: needs_grad(s) and not is_out(s) and not is_backward_op(s), first_per_op=True),
)
def test_torch_compile_fullgraph_backward(sample):
    torch._dynamo.reset()
    _, _, public_args = fresh(sample)
    call, tensors = tensor_call(sample, public_args)
    leaves = [t for t in tensors if t.requires_grad]

    def grads(fn):
        outs = [o for o in sample_run.as_tuple(fn(*tensors)) if o.requires_grad]
        generator = torch.Generator(outs[0].device).manual_seed(0)
        upstream = [
            torch.randn(o.shape, generator=generator, dtype=o.dtype, device=o.device) for o in outs
        ]
        return torch.autograd.grad(outs, leaves, upstream, allow_unused=True)

    # aot_eager traces the joint forward and backward graph as Inductor does,
    # without the C++ compilation time; the kernels are the eager ones, so the
    # gradients are identical.
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    assert_identical(grads(compiled), grads(call))


@pytest.mark.parametrize("sample", _params(lambda s: not is_out(s), first_per_op=True))
def test_torch_export_keeps_the_op(sample):
    _, _, public_args = detached(fresh(sample))
    call, tensors = tensor_call(sample, public_args)

    class Module(torch.nn.Module):
        def forward(self, *inputs):
            return call(*inputs)

    exported = torch.export.export(Module(), tensors)
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert str(sample.op) in targets, targets
    assert_identical(
        sample_run.as_tuple(exported.module()(*tensors)), sample_run.as_tuple(call(*tensors))
    )


@pytest.mark.parametrize("sample", _params(lambda s: not is_out(s), first_per_op=True))
def test_jit_trace_records_the_op(sample):
    _, _, public_args = detached(fresh(sample))
    call, tensors = tensor_call(sample, public_args)
    traced = torch.jit.trace(call, tensors)
    assert sample.op._schema.name in str(traced.graph)
    assert_identical(sample_run.as_tuple(traced(*tensors)), sample_run.as_tuple(call(*tensors)))


# --- the profiler ------------------------------------------------------------


@pytest.mark.parametrize(
    "sample",
    _params(lambda s: needs_grad(s) and not is_out(s) and not is_backward_op(s), first_per_op=True),
)
def test_profiler_records_the_op_and_its_shapes_forward_and_backward(sample):
    """torch.profiler sees the op under its own name, forward and backward,
    with the shapes of its arguments (record_shapes=True): the dispatcher's
    event is a CPU event on every device, so the check runs on each."""
    _, _, public_args = fresh(sample)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
    ) as prof:
        outs = [o for o in sample_run.as_tuple(sample.wrapper(*public_args)) if o.requires_grad]
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    forward = sample.op._schema.name
    backward = fuseops.ops.backward_op(forward)  # None: ATen's ops compute the gradients
    ours = sorted({e.name for e in prof.events() if e.name.startswith("fuseops::")})
    calls = [e for e in prof.events() if e.name == forward]
    assert calls, ours
    # The dispatcher's event of the op (the autograd and device kernels run
    # inside it) records every argument's shape: a tensor's sizes, [] for
    # anything else.
    shapes = [list(a.shape) if isinstance(a, torch.Tensor) else [] for a in sample.args]
    assert shapes in [e.input_shapes for e in calls], [e.input_shapes for e in calls]
    if backward is None:
        return
    gradients = [e for e in prof.events() if e.name == backward]
    assert gradients, ours
    # Backward's first argument is the gradient of the first output.
    assert any(e.input_shapes and e.input_shapes[0] == list(outs[0].shape) for e in gradients), [
        e.input_shapes for e in gradients
    ]


# --- every CPU build -----------------------------------------------------------

#: Two CPU builds differ in vector width: in the order of sums (float32 or
#: float64 accumulation) and in fused multiply-adds, so their results agree
#: to a few units of float32/float64 rounding of the largest value, and to
#: one rounding step of bfloat16 (2^-7 relative) / float16 (2^-10) where such
#: a difference flips the final rounding. Relative to max(1, max|value|).
AGREEMENT = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.bfloat16: 2**-7,
    torch.float16: 2**-10,
}

#: Against the float64 reference rounded to the dtype (large samples): the
#: tolerances of the op files' numerics. float32/float64 accumulate in their
#: own dtype over rows of up to a few thousand elements (~1e-6 relative);
#: bfloat16/float16 compute in float32 and round once, within one unit in the
#: last place of the result plus one of an intermediate (bias add, residual)
#: where the kernel rounds it as the composite does. Relative to
#: max(1, max|value|), times sqrt(terms) for gradients that sum over rows.
REFERENCE = {torch.float64: 1e-5, torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def assert_within(got, want, tolerance, sample, terms=1):
    tol = tolerance.get(want.dtype, 0.0)
    scale = (
        max(1.0, want.abs().nan_to_num(posinf=0, neginf=0).max().item()) if want.numel() else 1.0
    )
    torch.testing.assert_close(
        got,
        want,
        rtol=tol,
        atol=tol * scale * math.sqrt(terms),
        equal_nan=True,
        msg=lambda m: f"{sample}: {m}",
    )


def float64_reference(sample, results, grad_outputs):
    """fuseops.reference.<op> on float64 copies of the sample's inputs, and
    float64 autograd through it: what run() returned as `results`, rounded to
    their dtypes, each with the number of terms it sums (a gradient of a
    parameter broadcast over rows sums one per row)."""
    _, _, public_args = fresh(sample)
    wide = [
        a.detach().double().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
        for a in public_args
    ]
    outs = sample_run.as_tuple(getattr(fuseops.reference, sample.name)(*wide))
    leaves = [
        (w, a) for w, a in zip(wide, public_args) if isinstance(a, torch.Tensor) and a.requires_grad
    ]
    grads = ()
    if leaves:
        grads = torch.autograd.grad(
            outs, [w for w, _ in leaves], [g.double() for g in grad_outputs]
        )
    largest = max(o.numel() for o in outs)
    wanted = [o.detach() for o in outs] + list(grads)
    terms = [1] * len(outs) + [largest / max(1, a.numel()) for _, a in leaves]
    assert len(wanted) == len(results), sample
    return [(w.to(r.dtype), k) for w, r, k in zip(wanted, results, terms)]


@pytest.fixture(scope="module")
def cpu_calls(tmp_path_factory):
    """Every CPU sample's call saved for the child processes (path), with
    what this process's build computed and, for the large samples with finite
    inputs, the float64 reference: computed once for all builds."""
    calls, expected = [], []
    for sample in SAMPLES["cpu"]:
        args, kwargs, _ = fresh(sample)
        saved = copy.deepcopy((args, kwargs))
        results, grad_outputs = sample_run.run(sample.op, args, kwargs)
        calls.append((sample.name, sample.overload, *saved, grad_outputs))
        finite = all(a.isfinite().all() for a in args if isinstance(a, torch.Tensor))
        reference = (
            float64_reference(sample, results, grad_outputs) if sample.large and finite else None
        )
        expected.append((sample, results, reference))
    path = tmp_path_factory.mktemp("cpu_builds") / "calls.pt"
    torch.save(calls, path)
    return path, expected


@pytest.mark.slow
@pytest.mark.parametrize("capability", [c.lower() for c in CAPABILITY_ORDER])
def test_every_op_in_each_cpu_build(capability, cpu_calls, tmp_path):
    """Every CPU sample, forward and backward, in a child process forced to
    one CPU build: the same results as this process's build, and the large
    samples (several tasks per thread, a vector tail in every row) the
    float64 reference's, as the op files check this process's build. Samples
    with Inf or NaN inputs are compared with this process's build only: the
    op files check them against exact formulas (the textbook references
    give NaN where the limit exists)."""
    calls_path, expected = cpu_calls
    run_under_cpu_capability(
        capability,
        "import fuseops\nfrom support import sample_run\n"
        f"sample_run.main({str(calls_path)!r}, {str(tmp_path / 'results.pt')!r})\n",
    )
    actual = torch.load(tmp_path / "results.pt")
    assert len(actual) == len(expected)
    for got, (sample, want, reference) in zip(actual, expected):
        assert len(got) == len(want), sample
        for g, w in zip(got, want):
            assert_within(g, w, AGREEMENT, sample)
        if reference is not None:
            assert len(reference) == len(got), sample
            for g, (r, terms) in zip(got, reference):
                assert_within(g, r, REFERENCE, sample, terms)
