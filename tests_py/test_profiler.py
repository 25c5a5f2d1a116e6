"""torch.profiler charges an op's output allocations to its event
(profile_memory=True). That it sees every op under its own name with the
shapes of its arguments, forward and backward, is the conformance suite's
test_profiler_records_the_op_and_its_shapes_forward_and_backward."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import fuseops


def profiled(fn):
    with profile(
        activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True
    ) as prof:
        fn()
    return prof


def events_named(prof, name):
    return [e for e in prof.events() if e.name == name]


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
