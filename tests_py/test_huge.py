"""Tensors of more than 2**31 elements: ops index with 64-bit offsets, so
the far end of such a tensor (and the elements around 2**31, where a 32-bit
offset wraps) gets the right result.

Inputs come from torch.empty: only the regions a test writes are touched
(the rest reads as the kernel's zero pages and costs no memory), so the
peak is about one output, 4.3 GB (4.5 GB resident measured), well under
the 10 GB the machine can spare. Committing the output's fresh pages is
most of the time: about 6 s (relu) and 10 s (rms_norm) on two busy cores,
so they run in the test command; they are skipped, saying so, where less
than 12 GiB is available.
"""

from __future__ import annotations

import pytest
import torch

import fuseops
from fuseops import reference

BEYOND = 2**31 + 4099  # elements: past int32, with a vector tail


def available_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(available_bytes() < 12 * 2**30, reason="needs 12 GiB of available memory"),
]


def regions(n, width=4096):
    """Slices at the start, around 2**31 and at the far end of `n` elements."""
    return [slice(0, width), slice(2**31 - width // 2, 2**31 + width // 2), slice(n - width, n)]


def test_relu_bfloat16_beyond_2_31_elements():
    x = torch.empty(BEYOND, dtype=torch.bfloat16)
    for r in regions(BEYOND):
        x[r] = torch.randn(r.stop - r.start, dtype=torch.bfloat16)
    y = fuseops.relu(x)
    assert y.shape == x.shape
    for r in regions(BEYOND):
        assert torch.equal(y[r], reference.relu(x[r]))
    # A stride of 2**20 elements samples the whole tensor (offsets past 2**31
    # included) without touching it all.
    assert torch.equal(y[:: 2**20], reference.relu(x[:: 2**20]))
    # In place (the out= path) on y, whose pages are already committed.
    for r in regions(BEYOND):
        y[r] = torch.randn(r.stop - r.start, dtype=torch.bfloat16)
    expected = [reference.relu(y[r]) for r in regions(BEYOND)]
    fuseops.relu(y, out=y)
    for r, want in zip(regions(BEYOND), expected):
        assert torch.equal(y[r], want)


@pytest.fixture
def output_cache():
    """fuseops keeps a freed output for the next one of its size: the
    backward's gradient reuses the forward's pages (committing 4.3 GB of
    fresh pages is most of the time these tests take)."""
    fuseops.cpu.set_output_cache_limit(5 * 2**30)
    yield
    fuseops.cpu.set_output_cache_limit(0)


def test_rms_norm_with_more_than_2_31_elements_in_all(output_cache):
    hidden = 4096
    rows = BEYOND // hidden + 1
    x = torch.empty(rows, hidden, dtype=torch.bfloat16)
    grad = torch.empty(rows, hidden, dtype=torch.bfloat16)
    w = torch.randn(hidden, dtype=torch.bfloat16)
    # Rows at both ends and the row that holds element 2**31.
    checked = [0, 2**31 // hidden, rows - 1]
    for row in checked:
        x[row] = torch.randn(hidden, dtype=torch.bfloat16)
        grad[row] = torch.randn(hidden, dtype=torch.bfloat16)
    hits = fuseops.cpu.output_memory_stats()["cache_hits"]
    out, rstd = fuseops.rms_norm_forward(x, w, 1e-6)
    for row in checked:
        want = reference.rms_norm(x[row].double(), w.double(), 1e-6)
        torch.testing.assert_close(
            out[row].double(), want, rtol=2**-7, atol=2**-7 * want.abs().max().item()
        )
    del out
    grad_x, grad_w = fuseops.rms_norm_backward(grad, x, w, rstd)
    assert fuseops.cpu.output_memory_stats()["cache_hits"] > hits
    want_x, want_w = reference.rms_norm_backward(
        grad[checked].double(), x[checked].double(), w.double(), rstd[checked].double()
    )
    # bfloat16 results of float32 math: one rounding (2**-8) with room.
    torch.testing.assert_close(
        grad_x[checked].double(), want_x, rtol=2**-7, atol=2**-7 * want_x.abs().max().item()
    )
    # Every other row of x and grad is 0 and adds nothing to the weight gradient.
    torch.testing.assert_close(
        grad_w.double(), want_w, rtol=2**-7, atol=2**-7 * want_w.abs().max().item()
    )
