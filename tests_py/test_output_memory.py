"""fuseops' allocator for large CPU outputs (cpp/ops/common/output_memory.h,
fuseops.cpu): whole huge pages, ordinary tensor behaviour, the cache and
tune_memory(). The allocator's thread safety is tested in C++
(tests_cpp/output_memory_test.cpp), where threads run without the GIL."""

from __future__ import annotations

import io
import pickle

import pytest
import torch

import fuseops
from support.processes import run_python

MiB = 1 << 20
HUGE_PAGE = 2 * MiB


@pytest.fixture(autouse=True)
def _huge_pages_on():
    # The allocator serves outputs once huge pages (or its cache) are on.
    fuseops.cpu.set_output_huge_pages(True)
    yield
    fuseops.cpu.set_output_huge_pages(False)


def test_by_default_outputs_come_from_pytorch():
    fuseops.cpu.set_output_huge_pages(False)
    before = fuseops.cpu.output_memory_stats()["allocations"]
    fuseops.relu(torch.randn(MiB))
    assert fuseops.cpu.output_memory_stats()["allocations"] == before


def _large_input() -> torch.Tensor:
    # 4 MiB + 4 bytes of float32: an odd size that rounds up to 6 MiB.
    return torch.randn(MiB + 1)


def test_large_output_is_whole_huge_pages_and_freed():
    x = _large_input()
    before = fuseops.cpu.output_memory_stats()
    y = fuseops.relu(x)
    during = fuseops.cpu.output_memory_stats()
    assert y.data_ptr() % HUGE_PAGE == 0
    assert during["allocations"] == before["allocations"] + 1
    assert during["bytes_in_use"] == before["bytes_in_use"] + 3 * HUGE_PAGE
    torch.testing.assert_close(y, torch.relu(x), rtol=0, atol=0)
    del y
    assert fuseops.cpu.output_memory_stats()["bytes_in_use"] == before["bytes_in_use"]


def test_small_output_comes_from_pytorch():
    before = fuseops.cpu.output_memory_stats()["allocations"]
    fuseops.relu(torch.randn(HUGE_PAGE // 4 - 1))
    assert fuseops.cpu.output_memory_stats()["allocations"] == before


def test_large_output_behaves_like_any_tensor():
    x = _large_input()
    expected = torch.relu(x)
    y = fuseops.relu(x)
    # pickling and torch.save copy the bytes out and back
    torch.testing.assert_close(pickle.loads(pickle.dumps(y)), expected, rtol=0, atol=0)
    buffer = io.BytesIO()
    torch.save(y, buffer)
    buffer.seek(0)
    torch.testing.assert_close(torch.load(buffer), expected, rtol=0, atol=0)
    # resize_ reallocates through the same allocator and keeps the values
    y.resize_(3 * MiB)
    torch.testing.assert_close(y[: MiB + 1], expected, rtol=0, atol=0)
    # numpy shares the memory (and, as for any tensor, the storage stops
    # being resizable)
    array = y.numpy()
    array[0] = 123.0
    assert y[0].item() == 123.0


def test_saved_tensors_and_gradients_from_the_allocator():
    x = _large_input().requires_grad_()
    y = fuseops.relu(x)  # y is saved for the backward
    grad = torch.randn_like(y)
    y.backward(grad)
    reference = torch.where(x.detach() > 0, grad, torch.zeros_like(grad))
    torch.testing.assert_close(x.grad, reference, rtol=0, atol=0)


def test_profiler_sees_the_allocation():
    x = _large_input()
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        y = fuseops.relu(x)
    events = [e for e in prof.key_averages() if e.key == "fuseops::relu"]
    assert events, [e.key for e in prof.key_averages()]
    assert events[0].cpu_memory_usage >= y.numel() * y.element_size()


def _transparent_huge_pages_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return "absent"
    return text[text.index("[") + 1 : text.index("]")]


# Resident huge pages of the mapping that holds address `ptr`, in kB.
_ANON_HUGE_PAGES_OF = """
def anon_huge_kb(ptr):
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                start, end = (int(v, 16) for v in fields[0].split("-"))
                inside = start <= ptr < end
            elif inside and fields[0] == "AnonHugePages:":
                return int(fields[1])
    raise AssertionError("no mapping holds the output")
"""


@pytest.mark.skipif(
    _transparent_huge_pages_mode() not in ("madvise", "always"),
    reason="this system gives no transparent huge pages to madvised memory",
)
def test_output_gets_huge_pages_where_the_system_allows():
    result = run_python(
        _ANON_HUGE_PAGES_OF
        + """
import torch, fuseops
x = torch.randn(16 << 20)
fuseops.cpu.set_output_cache_limit(1 << 30)  # the allocator in use, huge pages off
y = fuseops.relu(x)
print(anon_huge_kb(y.data_ptr()))
fuseops.cpu.set_output_huge_pages(True)
z = fuseops.relu(x)  # 64 MiB, written by the kernel
print(anon_huge_kb(z.data_ptr()))
"""
    )
    assert result.returncode == 0, result.stderr
    off, on = (int(v) for v in result.stdout.split()[-2:])
    assert off == 0 and on > 0, result.stdout


def test_correct_without_huge_pages():
    # PR_SET_THP_DISABLE: this process gets no transparent huge pages, as on
    # a system that has them off; the outputs are ordinary memory then.
    result = run_python(
        _ANON_HUGE_PAGES_OF
        + """
import ctypes, torch, fuseops
PR_SET_THP_DISABLE = 41
assert ctypes.CDLL(None).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0
fuseops.cpu.set_output_huge_pages(True)
x = torch.randn(16 << 20)
y = fuseops.relu(x)
assert torch.equal(y, torch.relu(x))
print(anon_huge_kb(y.data_ptr()))
"""
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) == 0, result.stdout


def test_cache_reuses_blocks_within_its_limit():
    x = _large_input()
    try:
        fuseops.cpu.set_output_cache_limit(8 * MiB)
        first = fuseops.relu(x)
        first_ptr = first.data_ptr()
        del first
        assert fuseops.cpu.output_memory_stats()["bytes_cached"] == 3 * HUGE_PAGE
        hits = fuseops.cpu.output_memory_stats()["cache_hits"]
        again = fuseops.relu(x)
        assert again.data_ptr() == first_ptr
        assert fuseops.cpu.output_memory_stats()["cache_hits"] == hits + 1
        torch.testing.assert_close(again, torch.relu(x), rtol=0, atol=0)
        del again
        fuseops.cpu.release_memory()
        assert fuseops.cpu.output_memory_stats()["bytes_cached"] == 0
    finally:
        fuseops.cpu.set_output_cache_limit(0)


def test_tune_memory_applies_and_undoes_in_its_process():
    # glibc's thresholds are process-wide: changed in a child, not here.
    result = run_python("""
import torch, fuseops
applied = fuseops.cpu.tune_memory(64 << 20)
assert applied == {"keep_bytes": 64 << 20, "glibc": True, "output_cache_limit": 64 << 20}, applied
assert fuseops.cpu.output_memory_stats()["cache_limit"] == 64 << 20
x = torch.randn(4 << 20)
for _ in range(3):
    y = fuseops.relu(x)
    assert torch.equal(y, torch.relu(x))
    del y
assert fuseops.cpu.output_memory_stats()["cache_hits"] == 2
assert fuseops.cpu.output_memory_stats()["huge_page_advised"] == 1  # one block, reused
fuseops.cpu.tune_memory(0)
stats = fuseops.cpu.output_memory_stats()
assert stats["cache_limit"] == 0 and stats["bytes_cached"] == 0, stats
default = fuseops.cpu.tune_memory()
assert 0 < default["keep_bytes"] <= 4 << 30
print("ok")
""")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_tune_memory_rejects_negative_bytes():
    with pytest.raises(ValueError, match="tune_memory: keep_bytes must be >= 0, got -1"):
        fuseops.cpu.tune_memory(-1)
    with pytest.raises(RuntimeError, match="argument 'bytes' must be >= 0"):
        fuseops.cpu.set_output_cache_limit(-1)


def test_every_op_allocates_through_empty_output():
    # The op pattern: outputs and scratch tensors of an op's shared code
    # (cpp/ops/<op>.cpp) come from detail::empty_output (or
    # empty_contiguous_like), so a new op's large CPU outputs land on huge
    # pages without anyone remembering to ask. CPU kernel files may keep
    # small per-thread scratch from at::empty.
    import re
    from pathlib import Path

    ops = Path(__file__).resolve().parents[1] / "cpp" / "ops"
    offenders = [
        f"{path.name}:{number}"
        for path in sorted(ops.glob("*.cpp")) + sorted((ops / "autograd").glob("*.cpp"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bat::(empty|zeros|empty_like|zeros_like)\(", line)
    ]
    assert not offenders, offenders
