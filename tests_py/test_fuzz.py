"""A fuzzer for every op: random shapes (empty, 0-d and hidden size 0
included), dtypes, layouts and out= aliasing, judged against float64 math
(fuseops.reference) or a clear error naming the op and the argument.

test_fuzz_out_aliasing: every tensor of a case lives in one random "arena"
buffer at a random offset with a random layout (permuted, strided), so
inputs overlap each other and out= overlaps them, partially or exactly;
out= may also be a weight or bias, the other output, a fresh tensor that
must be resized, an expand()ed tensor or one of another dtype. A call must
then either

- write into out= what the reference computes in float64 on copies of the
  inputs taken before the call, and leave every arena element that no out=
  tensor addresses bitwise unchanged; or
- raise an error naming the op and an out= argument, only where the rule of
  cpp/ops/common/checks.h refuses (an out= of another dtype, one whose
  elements overlap, two outputs sharing memory, a resize of an out= that
  shares an input's memory), and then leave the arena unchanged.

test_fuzz_allocating_gradients_and_missing_tensors: the allocating form on
random layouts against the reference; in float64 also its gradients (with
and without create_graph) against autograd of the reference; sometimes a
tensor argument is None (an error naming the op and that argument unless it
is optional), or the op's public backward op is called directly on tensors
that require grad (it must be differentiable or refuse, never drop the
gradient).

Tolerances, relative to max(1, largest |expected|) of each output: 1e-9 in
float64; 1e-5 in float32 (a few float32 roundings per element, the norms'
row sums included); 2**-7 in bfloat16 and 2**-9 in float16 (one rounding
of the result, 2**-9 and 2**-11, with a factor 4 for the float32 math
before it); gradients 1e-7 in float64 (sums over rows, still far from
float64 rounding). A wrong value from a kernel reading memory it has
already written is off by O(1).

FUSEOPS_FUZZ_ITERATIONS sets the number of cases (default 2000 per test, about 3 s in all);
FUSEOPS_FUZZ_SEED the first seed (default 0). A failure names the seed of
its case, which FUSEOPS_FUZZ_SEED=<seed> FUSEOPS_FUZZ_ITERATIONS=1 replays.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

import numpy as np
import pytest
import torch

import fuseops
from fuseops import reference

ITERATIONS = int(os.environ.get("FUSEOPS_FUZZ_ITERATIONS", "2000"))
FIRST_SEED = int(os.environ.get("FUSEOPS_FUZZ_SEED", "0"))

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
RTOL = {torch.float64: 1e-9, torch.float32: 1e-5, torch.bfloat16: 2**-7, torch.float16: 2**-9}
EPS = 1e-5


@dataclasses.dataclass
class Case:
    op: str  # the allocating overload, as error messages name it
    shapes: dict  # input name -> shape
    out_shapes: dict  # output (out= argument) name -> shape
    call: Callable  # call(inputs, **outs): the public function; out= form with outs
    reference: Callable  # reference(inputs as float64) -> {output name: float64 result}
    optional: tuple = ()  # inputs that may be None

    @property
    def out_op(self):
        return self.op + ("_out" if "." in self.op else ".out")


def rows_shape(rng):
    """Leading dimensions (possibly none or empty) and a hidden size."""
    lead = [int(rng.integers(0, 5)) if rng.random() < 0.1 else int(rng.integers(1, 5))
            for _ in range(int(rng.integers(0, 3)))]
    hidden = 0 if rng.random() < 0.1 else int(rng.integers(1, 20))
    return lead, hidden


def separate(op, *args, out=None):
    """swiglu/geglu with separate gate and up through torch.ops: the public
    functions read up=None as the packed form."""
    if out is None:
        return op(*args)
    op.out(*args, out=out)
    return out


def make_case(rng) -> Case:
    lead, hidden = rows_shape(rng)
    shape = tuple(lead + [hidden])
    form = str(rng.choice(["none", "tanh"]))
    kind = str(rng.choice(["relu", "gelu", "silu", "bias_gelu", "swiglu", "geglu",
                           "swiglu.packed", "geglu.packed", "rms_norm", "fused_add_rms_norm",
                           "layer_norm"]))
    if kind in ("relu", "silu"):
        shape = () if rng.random() < 0.1 else shape
        return Case(f"fuseops::{kind}", {"input": shape}, {"out": shape},
                    lambda i, **o: getattr(fuseops, kind)(i["input"], **o),
                    lambda i: {"out": getattr(reference, kind)(i["input"])})
    if kind == "gelu":
        shape = () if rng.random() < 0.1 else shape
        return Case("fuseops::gelu", {"input": shape}, {"out": shape},
                    lambda i, **o: fuseops.gelu(i["input"], form, **o),
                    lambda i: {"out": reference.gelu(i["input"], form)})
    if kind == "bias_gelu":
        return Case("fuseops::bias_gelu", {"input": shape, "bias": (hidden,)}, {"out": shape},
                    lambda i, **o: fuseops.bias_gelu(i["input"], i["bias"], form, **o),
                    lambda i: {"out": reference.bias_gelu(i["input"], i["bias"], form)})
    if kind == "swiglu":
        return Case("fuseops::swiglu", {"gate": shape, "up": shape}, {"out": shape},
                    lambda i, **o: separate(torch.ops.fuseops.swiglu, i["gate"], i["up"], **o),
                    lambda i: {"out": reference.swiglu(i["gate"], i["up"])})
    if kind == "geglu":
        return Case("fuseops::geglu", {"gate": shape, "up": shape}, {"out": shape},
                    lambda i, **o: separate(torch.ops.fuseops.geglu, i["gate"], i["up"], form,
                                            **o),
                    lambda i: {"out": reference.geglu(i["gate"], i["up"], form)})
    packed = tuple(lead + [2 * hidden])
    if kind == "swiglu.packed":
        return Case("fuseops::swiglu.packed", {"input": packed}, {"out": shape},
                    lambda i, **o: fuseops.swiglu(i["input"], **o),
                    lambda i: {"out": reference.swiglu(i["input"])})
    if kind == "geglu.packed":
        return Case("fuseops::geglu.packed", {"input": packed}, {"out": shape},
                    lambda i, **o: fuseops.geglu(i["input"], None, form, **o),
                    lambda i: {"out": reference.geglu(i["input"], None, form)})
    if kind == "rms_norm":
        return Case("fuseops::rms_norm", {"input": shape, "weight": (hidden,)}, {"out": shape},
                    lambda i, **o: fuseops.rms_norm(i["input"], i["weight"], EPS, **o),
                    lambda i: {"out": reference.rms_norm(i["input"], i["weight"], EPS)},
                    ("weight",))
    if kind == "fused_add_rms_norm":
        return Case("fuseops::fused_add_rms_norm",
                    {"input": shape, "residual": shape, "weight": (hidden,)},
                    {"out": shape, "residual_out": shape},
                    lambda i, **o: fuseops.fused_add_rms_norm(
                        i["input"], i["residual"], i["weight"], EPS, **o),
                    fused_add_rms_norm_reference, ("weight",))
    return Case("fuseops::layer_norm",
                {"input": shape, "weight": (hidden,), "bias": (hidden,)}, {"out": shape},
                lambda i, **o: fuseops.layer_norm(i["input"], i["weight"], i["bias"], EPS, **o),
                lambda i: {"out": reference.layer_norm(i["input"], i["weight"], i["bias"], EPS)},
                ("weight", "bias"))


def fused_add_rms_norm_reference(inputs):
    # The kernels round the new residual to the input dtype before
    # normalizing it, as later layers read it; `dtype_sum` carries that sum.
    new_residual = inputs["dtype_sum"]
    return {"out": reference.rms_norm(new_residual, inputs["weight"], EPS),
            "residual_out": new_residual}


def extent(shape, strides):
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, strides))


def random_layout(rng, shape):
    """Strides of a permuted, possibly strided (step 2) layout of `shape`:
    distinct elements, as every layout PyTorch makes without as_strided."""
    order = list(rng.permutation(len(shape)))  # innermost last
    strides = [0] * len(shape)
    step = 1
    for d in reversed(order):
        stride_step = 2 if rng.random() < 0.25 else 1
        strides[d] = step * stride_step
        step *= max(shape[d], 1) * stride_step
    return strides


def place(rng, arena, shape, strides, window):
    offset = int(rng.integers(0, window + 1))
    return arena.as_strided(shape, strides, offset)


def storage_span(t):
    """(first, last + 1) element offsets `t` addresses in its storage."""
    if t.numel() == 0:
        return (0, 0)
    return t.storage_offset(), t.storage_offset() + extent(t.shape, t.stride())


def spans_intersect(a, b):
    (a0, a1), (b0, b1) = storage_span(a), storage_span(b)
    return a0 < b1 and b0 < a1


def same_storage(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def make_out(rng, mode, arena, inputs, result_shape, dtype, window):
    if mode == "fresh":
        return torch.full(result_shape, float("nan"), dtype=dtype)
    if mode == "fresh_resize":
        return torch.empty(int(rng.integers(0, 3)), dtype=dtype)
    if mode == "fresh_strided":
        strides = random_layout(rng, result_shape)
        size = max(extent(result_shape, strides), 1)
        return torch.full((size,), float("nan"), dtype=dtype).as_strided(result_shape, strides)
    if mode == "other_dtype":
        other = torch.float64 if dtype != torch.float64 else torch.float32
        return torch.empty(result_shape, dtype=other)
    if mode == "expanded":
        if len(result_shape) == 0 or result_shape[0] < 2 or 0 in result_shape:
            return torch.empty(result_shape, dtype=dtype)
        return torch.empty((1,) + tuple(result_shape[1:]), dtype=dtype).expand(result_shape)
    if mode == "input":
        name = str(rng.choice(sorted(inputs)))
        return inputs[name]
    return place(rng, arena, result_shape, random_layout(rng, result_shape), window)


OUT_MODES = ["fresh", "fresh_resize", "fresh_strided", "other_dtype", "expanded", "input",
             "arena", "arena", "arena"]


def allowed_refusal(case, dtype, inputs, outs):
    """The out= arguments the rule of ops/common/checks.h refuses here."""
    reasons = []
    for name, out in outs.items():
        if out.dtype != dtype:
            reasons.append(name)
        if any(st == 0 and s > 1 for s, st in zip(out.shape, out.stride())):
            reasons.append(name)
        if tuple(out.shape) != tuple(case.out_shapes[name]) and any(
                same_storage(out, t) for t in inputs.values()):
            reasons.append(name)
    names = list(outs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if outs[a] is outs[b] or (outs[a].numel() and outs[b].numel() and same_storage(
                    outs[a], outs[b]) and spans_intersect(outs[a], outs[b])):
                reasons += [a, b]
    return reasons


def bits(t):
    return t.view(torch.int16 if t.element_size() == 2 else
                  torch.int32 if t.element_size() == 4 else torch.int64).clone()


def run_case(seed):
    rng = np.random.default_rng(seed)
    case = make_case(rng)
    dtype = DTYPES[int(rng.integers(0, len(DTYPES)))]
    strides = {n: random_layout(rng, s) for n, s in case.shapes.items()}
    window = sum(int(np.prod(s)) for s in case.shapes.values()) + 4
    # Room for any layout random_layout() draws (at most a step of 2 per dim).
    size = window + max(int(np.prod([2 * max(d, 1) for d in s]))
                        for s in list(case.shapes.values()) + list(case.out_shapes.values()))
    gen = torch.Generator().manual_seed(seed)
    arena = torch.randn(size + window, generator=gen, dtype=torch.float64).to(dtype)
    inputs = {n: place(rng, arena, s, strides[n], window) for n, s in case.shapes.items()}
    outs = {}
    for name, result_shape in case.out_shapes.items():
        mode = OUT_MODES[int(rng.integers(0, len(OUT_MODES)))]
        if name == "residual_out" and rng.random() < 0.1:
            outs[name] = outs["out"]
            continue
        outs[name] = make_out(rng, mode, arena, inputs, result_shape, dtype, window)

    inputs64 = {n: t.double() for n, t in inputs.items()}
    if "residual" in inputs:
        inputs64["dtype_sum"] = (inputs["input"] + inputs["residual"]).double()
    expected = case.reference(inputs64)
    arena_before = bits(arena)
    written = torch.zeros(arena.numel(), dtype=torch.bool)
    refusable = allowed_refusal(case, dtype, inputs, outs)
    context = f"seed {seed}: {case.out_op} {dtype} shapes {case.shapes} " + ", ".join(
        f"{n} {tuple(o.shape)}/{o.stride()}@{o.storage_offset()}"
        f"{' (arena)' if same_storage(o, arena) else ''}" for n, o in outs.items())
    try:
        case.call(inputs, **outs)
    except RuntimeError as error:
        message = str(error).splitlines()[0]
        assert refusal_named(message, case.out_op, refusable), f"{context}: {message}"
        assert torch.equal(bits(arena), arena_before), f"{context}: refused after writing"
        return
    for name, out in outs.items():
        if out.dtype != dtype:
            raise AssertionError(f"{context}: {name} of dtype {out.dtype} accepted")
        want = expected[name]
        assert tuple(out.shape) == tuple(want.shape), context
        scale = max(1.0, want.abs().max().item() if want.numel() else 0.0)
        tol = RTOL[dtype] * scale
        torch.testing.assert_close(out.double(), want, rtol=RTOL[dtype], atol=tol,
                                   equal_nan=True, msg=lambda m: f"{context}: {name}: {m}")
        if same_storage(out, arena) and out.numel():
            written.as_strided(out.shape, out.stride(), out.storage_offset()).fill_(True)
    untouched = ~written
    assert torch.equal(bits(arena)[untouched], arena_before[untouched]), \
        f"{context}: wrote outside out="


def backward_op_call(case, inputs, grad):
    """Calls the public backward op of `case` directly: returns its op name
    and its tensor results."""
    x, w = inputs.get("input"), inputs.get("weight")
    base = case.op.split(".")[0]
    if base == "fuseops::relu":
        results = fuseops.relu_backward(grad, fuseops.relu(x.detach()))
    elif base == "fuseops::gelu":
        results = fuseops.gelu_backward(grad, x)
    elif base == "fuseops::silu":
        results = fuseops.silu_backward(grad, x)
    elif base == "fuseops::bias_gelu":
        results = fuseops.bias_gelu_backward(grad, x, inputs["bias"])
    elif case.op == "fuseops::swiglu":
        results = fuseops.swiglu_backward(grad, inputs["gate"], inputs["up"])
    elif case.op == "fuseops::geglu":
        results = fuseops.geglu_backward(grad, inputs["gate"], inputs["up"])
    elif case.op == "fuseops::swiglu.packed":
        return "fuseops::swiglu_backward.packed", (fuseops.swiglu_backward(grad, x),)
    elif case.op == "fuseops::geglu.packed":
        return "fuseops::geglu_backward.packed", (fuseops.geglu_backward(grad, x),)
    elif base == "fuseops::rms_norm":
        rstd = fuseops.rms_norm_forward(x.detach(), None if w is None else w.detach(), EPS)[1]
        results = fuseops.rms_norm_backward(grad, x, w, rstd)
    elif base == "fuseops::fused_add_rms_norm":
        rstd = fuseops.rms_norm_forward(x.detach(), None if w is None else w.detach(), EPS)[1]
        results = fuseops.fused_add_rms_norm_backward(grad, None, x, w, rstd)
    else:
        _, mean, rstd = fuseops.layer_norm_forward(
            x.detach(), None if w is None else w.detach(), None, EPS)
        results = fuseops.layer_norm_backward(grad, x, w, mean, rstd)
    return base + "_backward", results if isinstance(results, tuple) else (results,)


# Backward ops with a derivative of their own; the others refuse to record
# one (cpp/ops/autograd/no_derivative.h).
DIFFERENTIABLE_BACKWARD = {"fuseops::relu_backward", "fuseops::gelu_backward",
                           "fuseops::silu_backward"}


def run_functional_case(seed):
    """The allocating form on random layouts, with gradients (float64, with
    and without create_graph), a tensor left out (None), or a direct call
    of the backward op on tensors that require grad."""
    rng = np.random.default_rng(seed)
    case = make_case(rng)
    dtype = DTYPES[int(rng.integers(0, len(DTYPES)))]
    gen = torch.Generator().manual_seed(seed)
    inputs = {}
    for name, shape in case.shapes.items():
        strides = random_layout(rng, shape)
        base = torch.randn(max(extent(shape, strides), 1), generator=gen, dtype=torch.float64)
        inputs[name] = base.to(dtype).as_strided(shape, strides)
    context = f"seed {seed}: {case.op} {dtype} shapes {case.shapes}"
    if rng.random() < 0.15:
        missing = str(rng.choice(sorted(inputs)))
        inputs[missing] = None
        context += f", {missing}=None"
        if missing not in case.optional:
            with pytest.raises(RuntimeError) as info:
                case.call(inputs)
            assert refusal_named(str(info.value), case.op, [missing]), f"{context}: {info.value}"
            return
    differentiable = dtype == torch.float64
    leaves = {n: t.detach().requires_grad_(differentiable) for n, t in inputs.items()
              if t is not None}

    if differentiable and rng.random() < 0.2:
        grad = torch.randn(case.out_shapes["out"], generator=gen, dtype=dtype,
                           requires_grad=True)
        try:
            op, results = backward_op_call(case, leaves, grad)
        except RuntimeError as error:
            assert "not differentiable" in str(error), f"{context}: {error}"
            return
        assert op in DIFFERENTIABLE_BACKWARD, f"{context}: {op} recorded no refusal"
        (g,) = torch.autograd.grad(sum(r.sum() for r in results), [grad])
        assert g is not None, f"{context}: no gradient through {op}"
        return

    results = case.call({n: leaves.get(n) for n in inputs})
    results = results if isinstance(results, tuple) else (results,)
    inputs64 = {n: None if t is None else t.detach().double().requires_grad_(differentiable)
                for n, t in inputs.items()}
    if "residual" in inputs:
        inputs64["dtype_sum"] = (inputs64["input"] + inputs64["residual"] if differentiable
                                 else (inputs["input"] + inputs["residual"]).double())
    expected = case.reference(inputs64)
    for name, result in zip(case.out_shapes, results):
        want = expected[name]
        scale = max(1.0, want.abs().max().item() if want.numel() else 0.0)
        torch.testing.assert_close(result.detach().double(), want.detach(), rtol=RTOL[dtype],
                                   atol=RTOL[dtype] * scale, equal_nan=True,
                                   msg=lambda m: f"{context}: {name}: {m}")
    if not differentiable:
        return
    create_graph = bool(rng.random() < 0.5)
    upstream = [torch.randn(r.shape, generator=gen, dtype=dtype) for r in results]
    names = sorted(leaves)
    try:
        grads = torch.autograd.grad(sum((r * u).sum() for r, u in zip(results, upstream)),
                                    [leaves[n] for n in names], create_graph=create_graph)
    except RuntimeError as error:
        # Double backward of an op whose backward has no derivative.
        assert create_graph and "not differentiable" in str(error), f"{context}: {error}"
        return
    wanted = torch.autograd.grad(
        sum((expected[n] * u).sum() for n, u in zip(case.out_shapes, upstream)),
        [inputs64[n] for n in names])
    for name, got, want in zip(names, grads, wanted):
        scale = max(1.0, want.abs().max().item() if want.numel() else 0.0)
        torch.testing.assert_close(got.detach(), want, rtol=1e-7, atol=1e-7 * scale,
                                   msg=lambda m: f"{context}: grad {name}: {m}")


def refusal_named(message, op, refusable):
    return op in message and any(f"'{name}'" in message for name in refusable)


def block_seeds(block):
    per_block = (ITERATIONS + 3) // 4
    return range(FIRST_SEED + block * per_block,
                 FIRST_SEED + min((block + 1) * per_block, ITERATIONS))


@pytest.mark.parametrize("block", range(4))
def test_fuzz_out_aliasing(block):
    for seed in block_seeds(block):
        run_case(seed)


@pytest.mark.parametrize("block", range(4))
def test_fuzz_allocating_gradients_and_missing_tensors(block):
    for seed in block_seeds(block):
        run_functional_case(seed)
