"""CUDA kernels run on the current stream.

Every kernel launch in cuda/ names a stream, and the files take it from
PyTorch's current stream (checked on the sources, everywhere). Where a GPU
exists, every CUDA conformance sample also runs on a side stream whose
inputs are written there just before the call, behind a long sleep: a
kernel launched on any other stream would read them before they are
written. Results must match the same call on the default stream bit for bit.
"""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

from test_conformance import SAMPLES, assert_identical, detached, fresh, outputs

CUDA_SOURCES = sorted((pathlib.Path(__file__).resolve().parents[1] / "cuda").glob("*.cu*"))
LAUNCH = re.compile(r"<<<(.*?)>>>", re.S)


def test_cuda_sources_are_found():
    assert len(CUDA_SOURCES) >= 10, CUDA_SOURCES


@pytest.mark.parametrize("path", CUDA_SOURCES, ids=lambda p: p.name)
def test_every_launch_names_the_current_stream(path):
    text = path.read_text()
    launches = LAUNCH.findall(text)
    for launch in launches:
        params = [p.strip() for p in re.sub(r"\(.*?\)", "()", " ".join(launch.split())).split(",")]
        # grid, block, shared memory, stream: without the fourth a kernel
        # goes to the legacy default stream whatever the caller chose.
        assert len(params) == 4, f"{path.name}: launch <<<{launch}>>> names no stream"
    if launches:
        # Either the file takes PyTorch's current stream, or its launcher is
        # handed one (a shared header: its callers take the current stream).
        assert "getCurrentCUDAStream" in text or "cudaStream_t stream" in text, (
            f"{path.name} launches kernels on a stream it does not take from PyTorch"
        )


CUDA_CALLS = [s for s in SAMPLES.get("cuda", []) if not s.kwargs]


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: the kernels are compiled, not run"
)
@pytest.mark.parametrize("sample", CUDA_CALLS, ids=repr)
def test_side_stream_with_inputs_written_there(sample):
    # Two copies of the inputs: ops that write into an input
    # (cross_entropy_inplace) change the first.
    args, kwargs, _ = detached(fresh(sample))
    sources, _, _ = detached(fresh(sample))
    expected = outputs(sample.op(*args, **kwargs), kwargs)
    torch.cuda.synchronize()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        inputs = [torch.empty_like(a) if isinstance(a, torch.Tensor) else a for a in sources]
        # The inputs only hold their values once the sleep is over.
        torch.cuda._sleep(100_000_000)
        for target, source in zip(inputs, sources):
            if isinstance(source, torch.Tensor):
                target.copy_(source)
        actual = outputs(sample.op(*inputs, **kwargs), kwargs)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert_identical(actual, expected)
