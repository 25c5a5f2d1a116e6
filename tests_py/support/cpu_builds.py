"""fuseops' per-CPU-capability builds of its kernels: which ones this CPU
runs, and running code in a child process forced to one of them. The
builds requested and exercised here are reported (and a wrongly skipped
one fails the run) by the hooks in conftest.py."""

from __future__ import annotations

import json
import os

import pytest

import fuseops

from support.processes import run_python

CAPABILITY_ORDER = ["DEFAULT", "AVX2", "AVX512"]

# Builds whose per-build test was collected / ran fuseops kernels in that
# build and nothing else (see pytest_sessionfinish in conftest.py).
capabilities_requested: set[str] = set()
capabilities_exercised: set[str] = set()


def cpu_capabilities() -> list[str]:
    return list(fuseops.build_info()["cpu_capabilities"])


def cpu_runs(capability: str) -> bool:
    """Whether this CPU can execute code built for `capability`, as fuseops
    reads it from CPUID (test_build checks that against /proc/cpuinfo).
    ATen does not lower a forced ATEN_CPU_CAPABILITY the CPU lacks, so the
    per-build tests run only these."""
    return capability.upper() in fuseops.build_info()["runnable_cpu_capabilities"]


def run_under_cpu_capability(capability: str, code: str, env: dict[str, str] | None = None) -> None:
    """Runs `code` (which calls fuseops ops and checks their results) in a
    fresh interpreter with ATEN_CPU_CAPABILITY=`capability` (and `env`'s
    other variables), so that fuseops
    picks that build of its kernels, and proves it did: the child's kernel
    calls must all have run in exactly that build. Fails if the build is
    missing; skips only where this CPU cannot execute it (forcing a
    capability the CPU lacks makes ATen itself execute illegal
    instructions)."""
    capability = capability.upper()
    if capability not in cpu_capabilities():
        pytest.fail(f"{capability} build missing: {cpu_capabilities()}")
    capabilities_requested.add(capability)
    if not cpu_runs(capability):
        pytest.skip(f"this CPU cannot run {capability} code")
    code += (
        "\nimport json\n"
        "print(fuseops.build_info()['selected_cpu_capability'],"
        " json.dumps(fuseops._C.cpu_kernel_calls()))\n"
    )
    # The child can import the helpers in tests_py/support (sample_run).
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pythonpath = os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p)
    result = run_python(
        code, {**(env or {}), "ATEN_CPU_CAPABILITY": capability.lower(), "PYTHONPATH": pythonpath}
    )
    assert result.returncode == 0, result.stderr
    selected, calls = result.stdout.strip().splitlines()[-1].split(" ", 1)
    assert selected == capability
    calls = json.loads(calls)
    assert calls[capability] > 0, f"no fuseops kernel ran: {calls}"
    assert all(n == 0 for cap, n in calls.items() if cap != capability), calls
    capabilities_exercised.add(capability)
