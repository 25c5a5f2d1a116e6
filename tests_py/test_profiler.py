"""torch.profiler sees every fuseops op under its own name with the shapes of
its inputs, forward and backward (record_shapes=True), and its output
allocations (profile_memory=True). Every op's conformance samples that
require grad feed it, so a new op is covered with its module."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import fuseops
from support import sample_run
from test_conformance import _params, fresh, is_backward_op, is_out, needs_grad


def profiled(fn):
    with profile(
        activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True
    ) as prof:
        fn()
    return prof


def events_named(prof, name):
    return [e for e in prof.events() if e.name == name]


def shapes_of(args) -> list:
    """The shapes the profiler records for a call's arguments: a tensor's
    sizes, [] for anything else."""
    return [list(a.shape) if isinstance(a, torch.Tensor) else [] for a in args]


@pytest.mark.parametrize(
    "sample",
    _params(lambda s: needs_grad(s) and not is_out(s) and not is_backward_op(s), first_per_op=True),
)
def test_profiler_records_the_op_and_its_shapes_forward_and_backward(sample):
    args, _, public_args = fresh(sample)
    if any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args):
        pytest.skip("CPU profiling")  # CUDA events are a GPU machine's check
    results = []

    def run():
        outs = [o for o in sample_run.as_tuple(sample.wrapper(*public_args)) if o.requires_grad]
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        results.extend(outs)

    prof = profiled(run)
    forward = sample.op._schema.name
    backward = fuseops.ops.backward_op(forward)
    calls = events_named(prof, forward)
    assert calls, sorted({e.name for e in prof.events() if e.name.startswith("fuseops::")})
    # The dispatcher's event of the op (the autograd and CPU kernels run
    # inside it) records every argument's shape.
    assert shapes_of(sample.args) in [e.input_shapes for e in calls], [
        e.input_shapes for e in calls
    ]
    if backward is None:
        return  # the gradients are ATen's ops (the op module says so)
    gradients = events_named(prof, backward)
    assert gradients, sorted({e.name for e in prof.events() if e.name.startswith("fuseops::")})
    # Backward's first argument is the gradient of the first output.
    assert any(e.input_shapes and e.input_shapes[0] == list(results[0].shape) for e in gradients), [
        e.input_shapes for e in gradients
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_profiler_memory_shows_the_output_allocation(dtype):
    # relu allocates exactly its output; rms_norm_forward its output and the
    # float32 rstd per row. The profiler charges them to the op's event.
    x = torch.randn(512, 1024, dtype=dtype)
    w = torch.randn(1024, dtype=dtype)
    prof = profiled(lambda: (fuseops.relu(x), fuseops.rms_norm_forward(x, w, 1e-6)))
    relu = events_named(prof, "fuseops::relu")
    assert len(relu) == 1 and relu[0].cpu_memory_usage == x.numel() * x.element_size()
    norm = events_named(prof, "fuseops::rms_norm_forward")
    expected = x.numel() * x.element_size() + x.shape[0] * 4
    assert len(norm) == 1 and norm[0].cpu_memory_usage == expected, norm[0].cpu_memory_usage
    # The out= form allocates nothing.
    out = torch.empty_like(x)
    prof = profiled(lambda: fuseops.relu(x, out=out))
    (call,) = events_named(prof, "fuseops::relu")
    assert call.cpu_memory_usage == 0
