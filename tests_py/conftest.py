"""Shared pytest helpers for fuseops."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest
import torch

import fuseops

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def cpu_capabilities() -> list[str]:
    return list(fuseops.build_info()["cpu_capabilities"])


def run_python(code: str, env_overrides: dict[str, str] | None = None) -> subprocess.CompletedProcess:
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


@functools.lru_cache(maxsize=None)
def _native_cpu_capability() -> str:
    # ATen's own pick in a fresh process without ATEN_CPU_CAPABILITY: the best
    # this CPU supports.
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    result = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        env=env, capture_output=True, text=True, timeout=300, check=True,
    )
    return result.stdout.strip().upper()


def cpu_runs(capability: str) -> bool:
    """Whether this CPU can execute code built for `capability` (ATen does
    not lower a forced ATEN_CPU_CAPABILITY the CPU lacks)."""
    order = ["DEFAULT", "AVX2", "AVX512"]
    native = _native_cpu_capability()
    if native not in order:
        return capability.upper() == "DEFAULT"
    return order.index(capability.upper()) <= order.index(native)


def run_under_cpu_capability(capability: str, code: str) -> None:
    """Runs `code` (checks of fuseops against ATen) in a fresh interpreter
    with ATEN_CPU_CAPABILITY=`capability`, so that fuseops picks that build
    of its kernels, and checks that it did. Fails if the build is missing;
    skips where this CPU cannot run it (forcing a capability the CPU lacks
    makes ATen itself execute illegal instructions; the gtests still run
    every build this CPU can)."""
    if capability.upper() not in cpu_capabilities():
        pytest.fail(f"{capability} build missing: {cpu_capabilities()}")
    if not cpu_runs(capability):
        pytest.skip(f"this CPU cannot run {capability} code")
    code += "\nprint(fuseops.build_info()['selected_cpu_capability'])\n"
    result = run_python(code, {"ATEN_CPU_CAPABILITY": capability})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == capability.upper()


def expect_error_mentions(call, fragments) -> None:
    """Expects `call()` to raise a RuntimeError whose message contains every
    one of `fragments` (the op's name, the argument's name, what is wrong)."""
    with pytest.raises(RuntimeError) as info:
        call()
    for fragment in fragments:
        assert fragment in str(info.value)
