"""Build-time `dependencies` of fuseops: torch, pinned in a wheel to the torch
that the wheel's C++ library is compiled against.

A source build (an sdist, `pip install .`) compiles against whatever torch the
build environment holds, so its requirement is the range pyproject.toml
declares. A wheel is a binary: libfuseops.so and fuseops._C link that one
torch's C++ symbols and load with no other, so its metadata says
`torch==<that version>`, as torchvision's wheels do. Then pip keeps the pair
together: it installs that torch beside the wheel, or refuses to install the
wheel next to another one, instead of leaving a pair that fails at import.

The pin is the full version, local tag included (`2.13.0+cpu`). Under PEP 440
`==2.13.0` would also accept `2.13.0+cu130`, or the CUDA build that the
default index serves as plain `2.13.0`: other builds, with other C++ symbols,
which fuseops' loader refuses (it compares the whole version string). pip
satisfies `==2.13.0+cpu` from where such a torch comes from (PyTorch's
per-variant index, or a folder of wheels given with --find-links), keeps it
when it is already installed, and otherwise stops at install time naming the
requirement. A torch without a local tag (the default index's) is pinned as a
plain `==2.13.0`.

The version is the one of the torch distribution importable here, read from
its metadata (what pip compares against) without importing torch: the build
backend runs in the interpreter that scikit-build-core hands to CMake, so it is
the torch CMake compiles against.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any, Mapping, Optional

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

_TORCH = "torch"


def build_torch_version() -> Optional[str]:
    """The version of the torch distribution in this environment, or None."""
    try:
        return importlib.metadata.version(_TORCH)
    except importlib.metadata.PackageNotFoundError:
        return None


def wheel_dependencies(source: list[str], torch_version: Optional[str]) -> list[str]:
    """`source` with its torch requirement pinned to `torch_version`.

    Without a torch in the build environment the source range is kept: the
    CMake configure that follows stops with its own message about installing
    torch and building with --no-build-isolation.
    """
    if torch_version is None:
        return list(source)
    pinned = []
    for line in source:
        requirement = Requirement(line)
        if requirement.name == _TORCH:
            if not requirement.specifier.contains(torch_version, prereleases=True):
                raise RuntimeError(
                    f"fuseops: the build environment has torch {torch_version}, outside the "
                    f"range pyproject.toml declares ({line!r}); install a torch in that range "
                    f"before building."
                )
            requirement.specifier = SpecifierSet(f"=={torch_version}")
        pinned.append(str(requirement))
    return pinned


class TorchPin:
    """A [[tool.dynamic-metadata]] provider for `dependencies`; its setting
    `dependencies` holds the source requirements."""

    def __init__(self) -> None:
        self._build_state = "wheel"

    def build_state(self, build_state: str) -> None:
        self._build_state = build_state

    def dynamic_wheel(self, settings: Mapping[str, Any]) -> dict[str, bool]:
        # The sdist's PKG-INFO marks Requires-Dist as Dynamic: the wheel built
        # from it pins another torch than the range it states.
        return {"dependencies": True}

    def dynamic_metadata(
        self, settings: Mapping[str, Any], project: Mapping[str, Any]
    ) -> dict[str, Any]:
        source = settings.get("dependencies")
        if not isinstance(source, list) or not all(isinstance(r, str) for r in source):
            raise RuntimeError("fuseops_torch_pin: set `dependencies` to a list of requirements")
        if self._build_state == "sdist":
            return {"dependencies": list(source)}
        return {"dependencies": wheel_dependencies(source, build_torch_version())}
