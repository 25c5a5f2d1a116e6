"""Loads libfuseops.so after checking it was built for the running torch.

A C++ extension compiled against one torch and imported with another fails
deep inside the dynamic loader ("undefined symbol: _ZN3c10...") or, worse,
loads and misbehaves. fuseops compares versions first and says what to do.
"""

from __future__ import annotations

import os

import torch

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
LIBRARY_PATH = os.path.join(_PACKAGE_DIR, "lib", "libfuseops.so")


class TorchVersionMismatchError(ImportError):
    """fuseops was compiled against a different torch than the one imported."""


def check_torch_version(built_against: str, running: str) -> None:
    """Raise TorchVersionMismatchError unless the two torch versions match.

    The whole version string is compared, local tag included ("+cpu",
    "+cu130"): builds with different tags have different C++ symbols.
    """
    if built_against == running:
        return
    raise TorchVersionMismatchError(
        f"fuseops was built against torch {built_against}, but torch {running} "
        f"is installed. Its C++ library only works with the torch it was "
        f"compiled against. Rebuild fuseops for this torch:\n"
        f"    pip install --no-build-isolation --force-reinstall --no-deps <path to fuseops source>\n"
        f"(or install torch=={built_against})."
    )


def load() -> None:
    from . import _build_config

    check_torch_version(_build_config.TORCH_VERSION, torch.__version__)
    if not os.path.exists(LIBRARY_PATH):
        raise ImportError(f"fuseops: {LIBRARY_PATH} is missing; reinstall fuseops")
    torch.ops.load_library(LIBRARY_PATH)
