"""Running code in a fresh Python interpreter."""

from __future__ import annotations

import os
import subprocess
import sys


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
