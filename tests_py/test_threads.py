"""Threads and determinism: many Python threads calling every op at once get
the single-threaded results bit for bit; every op's results (forward and
gradients) are bitwise identical run to run at a fixed thread count; and
the ops python/README.md lists as deterministic across thread counts give the
same bits with torch.set_num_threads(1), 2 and 3. Every op's conformance
samples feed it."""

from __future__ import annotations

import concurrent.futures

import pytest
import torch

import fuseops
import fuseops.ops.cases
from support import sample_run
from support.cpu_builds import run_under_cpu_capability
from test_conformance import SAMPLES, fresh

CPU = SAMPLES["cpu"]
SMALL = [s for s in CPU if not s.large]
LARGE = [s for s in CPU if s.large]


def run(sample, grad_outputs=None):
    args, kwargs, _ = fresh(sample)
    return sample_run.run(sample.op, args, kwargs, grad_outputs)


def grad_outputs_of(samples):
    torch.manual_seed(0)
    return [run(s)[1] for s in samples]


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_bitwise(got, want, context):
    assert len(got) == len(want), context
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.equal(raw(g), raw(w)), context


def test_concurrent_python_threads_get_the_single_threaded_results():
    grads = grad_outputs_of(SMALL)
    expected = [run(s, g)[0] for s, g in zip(SMALL, grads)]
    jobs = [i for _ in range(4) for i in range(len(SMALL))]
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda i: run(SMALL[i], grads[i])[0], jobs))
    for i, got in zip(jobs, results):
        assert_bitwise(got, expected[i], SMALL[i])


def test_results_are_bitwise_identical_run_to_run():
    grads = grad_outputs_of(LARGE)
    first = [run(s, g)[0] for s, g in zip(LARGE, grads)]
    for sample, g, want in zip(LARGE, grads, first):
        assert_bitwise(run(sample, g)[0], want, sample)


def differing_across_thread_counts(samples, counts=(1, 2, 3)):
    grads = grad_outputs_of(samples)
    before = torch.get_num_threads()
    results = {}
    try:
        for n in counts:
            torch.set_num_threads(n)
            results[n] = [run(s, g)[0] for s, g in zip(samples, grads)]
    finally:
        torch.set_num_threads(before)
    differing = set()
    for i, sample in enumerate(samples):
        for n in counts[1:]:
            try:
                assert_bitwise(results[n][i], results[counts[0]][i], sample)
            except AssertionError:
                differing.add(sample.name)
    return differing


#: The ops python/README.md ("Threads and determinism") names as the
#: exceptions, each declared beside it (``THREAD_COUNT_DEPENDENT`` in its op
#: module): results that are ATen's matrix products, whose bits across thread
#: counts are ATen's libraries'.
ATEN_PRODUCTS = {
    name for module in fuseops.ops.MODULES for name in getattr(module, "THREAD_COUNT_DEPENDENT", ())
}


def test_thread_count_determinism_is_as_documented():
    # Every result of every other op has the same bits whatever the thread
    # count (python/README.md, "Threads and determinism").
    assert differing_across_thread_counts(LARGE) - ATEN_PRODUCTS == set()


def row_reductions():
    """Each op's row_reduction_cases() (fuseops/ops/cases/<op>.py): the ops
    whose gradients or losses sum over rows, with enough rows for every
    thread to get several blocks."""
    for module in fuseops.ops.cases.MODULES:
        yield from getattr(module, "row_reduction_cases", list)()


def reduction_results(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        results = {}
        for name, call, leaves in row_reductions():
            y = call()
            results[name] = [y.detach(), *torch.autograd.grad(y, leaves, torch.ones_like(y))]
        return results
    finally:
        torch.set_num_threads(before)


def test_row_reductions_across_thread_counts():
    """Bitwise identical with 1, 2 and 3 threads (the sums over rows are
    split by the rows alone), and run to run."""
    one = reduction_results(1)
    for threads in (2, 3):
        other = reduction_results(threads)
        for name, results in one.items():
            for i, (a, b) in enumerate(zip(results, other[name])):
                assert torch.equal(raw(a), raw(b)), f"{name} result {i}, {threads} threads"
    again = reduction_results(2)
    for name, results in reduction_results(2).items():
        for i, (a, b) in enumerate(zip(results, again[name])):
            assert torch.equal(raw(a), raw(b)), f"{name} result {i} run to run"


NAN_CHILD = r"""
import torch
import fuseops
import fuseops.ops.cases

CANONICAL = {torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}


def with_nans(t):
    # Positive and negative quiet NaNs with payloads, and infinities (whose
    # products with zero make new NaNs), spread so that a vector holds both
    # kinds and every thread's share holds some.
    flat = t.view(-1)
    flat[::37] = float("nan")
    flat[11::53] = -float("nan")
    flat[5::61] = float("inf")
    flat[23::67] = -float("inf")
    return t


def calls(dtype):
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return with_nans(torch.randn(*shape, generator=g).to(dtype)).requires_grad_()

    rows, cols = 64, 4099  # odd columns: rows split mid-vector between threads
    gate, up, x, b = r(rows, cols), r(rows, cols), r(rows, cols), r(cols)
    w = (torch.rand(cols, generator=g) + 0.5).to(dtype).requires_grad_()
    yield "swiglu", lambda: fuseops.swiglu(gate, up), (gate, up)
    yield "geglu", lambda: fuseops.geglu(gate, up), (gate, up)
    yield "gelu", lambda: fuseops.gelu(x), (x,)
    yield "silu", lambda: fuseops.silu(x), (x,)
    yield "bias_gelu", lambda: fuseops.bias_gelu(x, b), (x,)
    yield "rms_norm", lambda: fuseops.rms_norm(x, w, 1e-6), (x,)


def results(dtype, threads):
    torch.set_num_threads(threads)
    out = {}
    for name, call, leaves in calls(dtype):
        y = call()
        grad = with_nans(torch.ones_like(y))
        out[name] = [y.detach(), *torch.autograd.grad(y, leaves, grad)]
    return out


for dtype, canonical in CANONICAL.items():
    one = results(dtype, 1)
    for threads in (2, 3):
        other = results(dtype, threads)
        for name, tensors in one.items():
            for i, (a, b) in enumerate(zip(tensors, other[name])):
                bits_a = a.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
                bits_b = b.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
                nan_bits = set(bits_a[a.isnan()].unique().tolist())
                assert a.isnan().any(), (name, i, dtype, "no NaN reached the output")
                assert nan_bits == {canonical}, (name, i, dtype, [hex(v) for v in nan_bits])
                assert torch.equal(bits_a, bits_b), (name, i, dtype, threads, "threads")
"""


@pytest.mark.slow
@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_reduced_nan_results_have_one_encoding_whatever_the_threads(capability):
    """bfloat16/float16 results write every NaN as c10's quiet NaN (0x7fc0 /
    0x7e00) in every CPU build, so NaN inputs give the same bits with 1, 2
    and 3 threads (README, "Threads and determinism"): ATen's vector
    conversions write 0xffff, the AVX-512 BF16 instruction the NaN's own
    sign, and the element's position in its vector decided which."""
    run_under_cpu_capability(capability, NAN_CHILD)
