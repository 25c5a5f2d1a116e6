"""Shared pytest helpers for fuseops."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch

import fuseops

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]

#: Every device tests run on: the CPU, and CUDA where this machine has it (no
#: CUDA parameter exists elsewhere, rather than one that is skipped).
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _inductor_cache_for_this_build() -> str:
    """torch.compile caches compiled graphs across processes, keyed by the
    Python-level graph: a graph compiled against another build of
    libfuseops (an op renamed or its autograd changed) would be reused and
    call ops that no longer exist. One cache folder per library build."""
    digest = hashlib.sha1()
    with open(fuseops.library_path, "rb") as library:
        for block in iter(lambda: library.read(1 << 20), b""):
            digest.update(block)
    return os.path.join(tempfile.gettempdir(), "fuseops-inductor-cache", digest.hexdigest()[:16])


os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", _inductor_cache_for_this_build())


def cpu_capabilities() -> list[str]:
    return list(fuseops.build_info()["cpu_capabilities"])


def run_python(
    code: str, env_overrides: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (for per-process settings such as
    ATEN_CPU_CAPABILITY, which ATen reads once)."""
    env = dict(os.environ)
    env.update(env_overrides or {})
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(autouse=True)
def _deterministic_seed():
    torch.manual_seed(0)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """Each device in DEVICES in turn."""
    return request.param


CAPABILITY_ORDER = ["DEFAULT", "AVX2", "AVX512"]


def cpu_runs(capability: str) -> bool:
    """Whether this CPU can execute code built for `capability`, as fuseops
    reads it from CPUID (test_build checks that against /proc/cpuinfo).
    ATen does not lower a forced ATEN_CPU_CAPABILITY the CPU lacks, so the
    per-build tests run only these."""
    return capability.upper() in fuseops.build_info()["runnable_cpu_capabilities"]


# Builds whose per-build test was collected / ran fuseops kernels in that
# build and nothing else (see pytest_sessionfinish).
_capabilities_requested: set[str] = set()
_capabilities_exercised: set[str] = set()


def run_under_cpu_capability(capability: str, code: str) -> None:
    """Runs `code` (which calls fuseops ops and checks their results) in a
    fresh interpreter with ATEN_CPU_CAPABILITY=`capability`, so that fuseops
    picks that build of its kernels, and proves it did: the child's kernel
    calls must all have run in exactly that build. Fails if the build is
    missing; skips only where this CPU cannot execute it (forcing a
    capability the CPU lacks makes ATen itself execute illegal
    instructions)."""
    capability = capability.upper()
    if capability not in cpu_capabilities():
        pytest.fail(f"{capability} build missing: {cpu_capabilities()}")
    _capabilities_requested.add(capability)
    if not cpu_runs(capability):
        pytest.skip(f"this CPU cannot run {capability} code")
    code += (
        "\nimport json\n"
        "print(fuseops.build_info()['selected_cpu_capability'],"
        " json.dumps(fuseops._C.cpu_kernel_calls()))\n"
    )
    # The child can import this folder's helpers (exact.py).
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    pythonpath = os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p)
    result = run_python(code, {"ATEN_CPU_CAPABILITY": capability.lower(), "PYTHONPATH": pythonpath})
    assert result.returncode == 0, result.stderr
    selected, calls = result.stdout.strip().splitlines()[-1].split(" ", 1)
    assert selected == capability
    calls = json.loads(calls)
    assert calls[capability] > 0, f"no fuseops kernel ran: {calls}"
    assert all(n == 0 for cap, n in calls.items() if cap != capability), calls
    _capabilities_exercised.add(capability)


def pytest_sessionfinish(session, exitstatus):
    """Fails the run when the CPU can execute a build whose per-build tests
    were collected but none of them ran it (a wrong skip would otherwise
    look like a pass)."""
    missing = sorted(
        cap
        for cap in _capabilities_requested
        if cpu_runs(cap) and cap not in _capabilities_exercised
    )
    if missing and session.exitstatus == 0:
        session.exitstatus = 1
    session.config._fuseops_missing_builds = missing


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _capabilities_requested:
        return
    runnable = fuseops.build_info()["runnable_cpu_capabilities"]
    terminalreporter.write_line(
        f"fuseops CPU builds exercised: {', '.join(sorted(_capabilities_exercised, key=CAPABILITY_ORDER.index)) or 'none'}"
        f" (this CPU runs {', '.join(runnable)})"
    )
    missing = getattr(config, "_fuseops_missing_builds", [])
    if missing:
        terminalreporter.write_line(
            f"FAILED: this CPU runs {', '.join(missing)} but no per-build test exercised it",
            red=True,
        )


def expect_error_mentions(call, fragments) -> None:
    """Expects `call()` to raise a RuntimeError whose message contains every
    one of `fragments` (the op's name, the argument's name, what is wrong)."""
    with pytest.raises(RuntimeError) as info:
        call()
    for fragment in fragments:
        assert fragment in str(info.value)
