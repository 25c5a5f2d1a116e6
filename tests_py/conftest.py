"""Shared pytest helpers for fuseops."""

from __future__ import annotations

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
