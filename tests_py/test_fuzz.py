"""A fuzzer for the out= forms of every op: random shapes (empty and 0-d included), dtypes, layouts and
out= aliasing, judged against float64 math or a clear refusal.

Every tensor of a case lives in one random "arena" buffer at a random
offset with a random layout (permuted, strided), so inputs overlap each
other and out= overlaps them, partially or exactly; out= may also be a
weight or bias, the other output, a fresh tensor that must be resized, an
expand()ed tensor or one of another dtype. A call must then either

- write into out= what fuseops.reference computes in float64 on copies of
  the inputs taken before the call, and leave every arena element that no
  out= tensor addresses bitwise unchanged; or
- raise an error naming the op and an out= argument, only where the rule of
  cpp/ops/common/checks.h refuses (an out= of another dtype, one whose
  elements overlap, two outputs sharing memory, a resize of an out= that
  shares an input's memory), and then leave the arena unchanged.

Tolerances, relative to max(1, largest |expected|) of each output: 1e-9 in
float64; 1e-5 in float32 (a few float32 roundings per element, the norms'
row sums included); 2**-7 in bfloat16 and 2**-9 in float16 (one rounding
of the result, 2**-9 and 2**-11, with a factor 4 for the float32 math
before it). A wrong value from a kernel reading memory it has already
written is off by O(1).

FUSEOPS_FUZZ_ITERATIONS sets the number of cases (default 2000, about 2 s);
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
    op: str  # the overload's name in error messages
    shapes: dict  # input name -> shape
    out_shapes: dict  # out= argument name -> shape of its result
    call: Callable  # call(inputs, outs)
    reference: Callable  # reference(inputs as float64) -> {out name: float64 result}
    same_index: tuple = ()  # inputs an out= may be exactly


def rows_shape(rng):
    """Leading dimensions (possibly none or empty) and a hidden size."""
    lead = [int(rng.integers(0, 5)) if rng.random() < 0.1 else int(rng.integers(1, 5))
            for _ in range(int(rng.integers(0, 3)))]
    hidden = 0 if rng.random() < 0.05 else int(rng.integers(1, 20))
    return lead, hidden


def gelu_form(rng):
    return str(rng.choice(["none", "tanh"]))


def make_case(rng) -> Case:
    lead, hidden = rows_shape(rng)
    shape = tuple(lead + [hidden])
    kind = str(rng.choice(["relu", "gelu", "silu", "bias_gelu", "swiglu", "geglu",
                           "swiglu.packed", "geglu.packed", "rms_norm", "fused_add_rms_norm",
                           "layer_norm"]))
    if kind in ("relu", "gelu", "silu"):
        if rng.random() < 0.1:
            shape = ()
        form = gelu_form(rng)
        if kind == "gelu":
            call = lambda i, o: fuseops.gelu(i["input"], form, out=o["out"])
            ref = lambda i: {"out": reference.gelu(i["input"], form)}
        else:
            call = lambda i, o: getattr(fuseops, kind)(i["input"], out=o["out"])
            ref = lambda i: {"out": getattr(reference, kind)(i["input"])}
        return Case(f"fuseops::{kind}.out", {"input": shape}, {"out": shape}, call, ref,
                    ("input",))
    if kind == "bias_gelu":
        form = gelu_form(rng)
        return Case("fuseops::bias_gelu.out", {"input": shape, "bias": (hidden,)},
                    {"out": shape},
                    lambda i, o: fuseops.bias_gelu(i["input"], i["bias"], form, out=o["out"]),
                    lambda i: {"out": reference.bias_gelu(i["input"], i["bias"], form)},
                    ("input",))
    if kind in ("swiglu", "geglu"):
        form = gelu_form(rng)
        if kind == "swiglu":
            call = lambda i, o: fuseops.swiglu(i["gate"], i["up"], out=o["out"])
            ref = lambda i: {"out": reference.swiglu(i["gate"], i["up"])}
        else:
            call = lambda i, o: fuseops.geglu(i["gate"], i["up"], form, out=o["out"])
            ref = lambda i: {"out": reference.geglu(i["gate"], i["up"], form)}
        return Case(f"fuseops::{kind}.out", {"gate": shape, "up": shape}, {"out": shape},
                    call, ref, ("gate", "up"))
    if kind in ("swiglu.packed", "geglu.packed"):
        packed = tuple(lead + [2 * hidden])
        form = gelu_form(rng)
        if kind == "swiglu.packed":
            call = lambda i, o: fuseops.swiglu(i["input"], out=o["out"])
            ref = lambda i: {"out": reference.swiglu(i["input"])}
        else:
            call = lambda i, o: fuseops.geglu(i["input"], None, form, out=o["out"])
            ref = lambda i: {"out": reference.geglu(i["input"], None, form)}
        return Case(f"fuseops::{kind.split('.')[0]}.packed_out", {"input": packed},
                    {"out": shape}, call, ref)
    if kind == "rms_norm":
        return Case("fuseops::rms_norm.out", {"input": shape, "weight": (hidden,)},
                    {"out": shape},
                    lambda i, o: fuseops.rms_norm(i["input"], i["weight"], EPS, out=o["out"]),
                    lambda i: {"out": reference.rms_norm(i["input"], i["weight"], EPS)},
                    ("input",))
    if kind == "fused_add_rms_norm":
        return Case("fuseops::fused_add_rms_norm.out",
                    {"input": shape, "residual": shape, "weight": (hidden,)},
                    {"out": shape, "residual_out": shape},
                    lambda i, o: fuseops.fused_add_rms_norm(
                        i["input"], i["residual"], i["weight"], EPS, out=o["out"],
                        residual_out=o["residual_out"]),
                    fused_add_rms_norm_reference, ("input", "residual"))
    return Case("fuseops::layer_norm.out",
                {"input": shape, "weight": (hidden,), "bias": (hidden,)}, {"out": shape},
                lambda i, o: fuseops.layer_norm(i["input"], i["weight"], i["bias"], EPS,
                                                out=o["out"]),
                lambda i: {"out": reference.layer_norm(i["input"], i["weight"], i["bias"], EPS)},
                ("input",))


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
    context = f"seed {seed}: {case.op} {dtype} shapes {case.shapes} " + ", ".join(
        f"{n} {tuple(o.shape)}/{o.stride()}@{o.storage_offset()}"
        f"{' (arena)' if same_storage(o, arena) else ''}" for n, o in outs.items())
    try:
        case.call(inputs, outs)
    except RuntimeError as error:
        message = str(error).splitlines()[0]
        assert refusal_named(message, case.op, refusable), f"{context}: {message}"
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


def refusal_named(message, op, refusable):
    return op in message and any(f"'{name}'" in message for name in refusable)


@pytest.mark.parametrize("block", range(4))
def test_fuzz_out_aliasing(block):
    per_block = (ITERATIONS + 3) // 4
    for seed in range(FIRST_SEED + block * per_block,
                      FIRST_SEED + min((block + 1) * per_block, ITERATIONS)):
        run_case(seed)
