"""Fixtures and pytest hooks for fuseops' tests; the helpers the test files
share are in support/."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

import pytest
import torch

import fuseops

from support.cpu_builds import (
    CAPABILITY_ORDER,
    capabilities_exercised,
    capabilities_requested,
    cpu_runs,
)
from support.params import DEVICES


def _inductor_cache_for_this_build() -> str:
    """torch.compile caches compiled graphs across processes, keyed by the
    Python-level graph: a graph compiled against another build of
    libfuseops (an op renamed or its autograd changed) would be reused and
    call ops that no longer exist. One cache folder per library build and
    forced CPU build: code generated for one ISA does not compile under
    ATEN_CPU_CAPABILITY=default."""
    digest = hashlib.sha1(os.environ.get("ATEN_CPU_CAPABILITY", "").encode())
    with open(fuseops.library_path, "rb") as library:
        for block in iter(lambda: library.read(1 << 20), b""):
            digest.update(block)
    return os.path.join(tempfile.gettempdir(), "fuseops-inductor-cache", digest.hexdigest()[:16])


os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", _inductor_cache_for_this_build())


@pytest.fixture(autouse=True)
def _deterministic_seed():
    torch.manual_seed(0)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """Each device in DEVICES in turn."""
    return request.param


def pytest_sessionfinish(session, exitstatus):
    """Fails the run when the CPU can execute a build whose per-build tests
    were collected but none of them ran it (a wrong skip would otherwise
    look like a pass). Under pytest-xdist (`-n`) each worker hands its
    builds to the controller (pytest_testnodedown), which decides."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["fuseops_builds"] = json.dumps(
            [sorted(capabilities_requested), sorted(capabilities_exercised)]
        )
        return
    missing = sorted(
        cap for cap in capabilities_requested if cpu_runs(cap) and cap not in capabilities_exercised
    )
    if missing and session.exitstatus == 0:
        session.exitstatus = 1
    session.config._fuseops_missing_builds = missing


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: a worker finished; merge the builds it
    requested and exercised."""
    builds = getattr(node, "workeroutput", {}).get("fuseops_builds")
    if builds is not None:
        requested, exercised = json.loads(builds)
        capabilities_requested.update(requested)
        capabilities_exercised.update(exercised)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not capabilities_requested:
        return
    runnable = fuseops.build_info()["runnable_cpu_capabilities"]
    terminalreporter.write_line(
        f"fuseops CPU builds exercised: {', '.join(sorted(capabilities_exercised, key=CAPABILITY_ORDER.index)) or 'none'}"
        f" (this CPU runs {', '.join(runnable)})"
    )
    missing = getattr(config, "_fuseops_missing_builds", [])
    if missing:
        terminalreporter.write_line(
            f"FAILED: this CPU runs {', '.join(missing)} but no per-build test exercised it",
            red=True,
        )
