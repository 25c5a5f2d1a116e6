"""Loads libfuseops.so after checking that it can work here.

A C++ extension compiled against one torch and imported with another fails
deep inside the dynamic loader ("undefined symbol: _ZN3c10...") or, worse,
loads and misbehaves; one whose files are missing fails with a bare
"No module named" or "cannot open shared object file"; a process forced onto
CPU kernels the CPU cannot execute dies of SIGILL at its first op. fuseops
checks each of these first and says what to do.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
LIBRARY_PATH = os.path.join(_PACKAGE_DIR, "lib", "libfuseops.so")

_REINSTALL = "pip install --no-build-isolation --force-reinstall --no-deps <path to fuseops source>"


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
        f"    {_REINSTALL}\n"
        f"(or install torch=={built_against})."
    )


class UnsupportedCpuError(ImportError):
    """ATen was forced onto CPU kernels this CPU cannot execute."""


# What each of ATen's x86 capabilities needs, as cpuinfo names the features
# (torch._C._cpu._get_cpu_capability()) and as /proc/cpuinfo does; ATen
# picks AVX512 itself only with all of these.
_CAPABILITY_FEATURES = {
    "AVX2": (("avx2", "fma3"), ("avx2", "fma")),
    "AVX512": (
        ("avx512_f", "avx512_bw", "avx512_vl", "avx512_dq", "fma3"),
        ("avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"),
    ),
}


def _cpu_features() -> Optional[tuple[set[str], int]]:
    """This CPU's features and which naming they follow (0: cpuinfo, the
    library ATen itself decides with; 1: /proc/cpuinfo), or None."""
    probe = getattr(getattr(torch._C, "_cpu", None), "_get_cpu_capability", None)
    if probe is not None:
        return {name for name, present in probe().items() if present is True}, 0
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split()), 1
    except OSError:
        pass
    return None


def cpu_runs(capability: str, features: Optional[tuple[set[str], int]] = None) -> bool:
    """Whether this CPU (or the given features) executes ATen's `capability`
    build; True for builds without a known requirement (DEFAULT) and when
    the CPU cannot be asked."""
    needs = _CAPABILITY_FEATURES.get(capability.upper())
    if needs is None:
        return True
    features = _cpu_features() if features is None else features
    if features is None:
        return True
    names, naming = features
    return all(feature in names for feature in needs[naming])


def check_cpu_capability(aten_capability: str, runs: bool) -> None:
    """Raise UnsupportedCpuError when ATen uses `aten_capability`
    (torch.backends.cpu.get_cpu_capability()) but the CPU cannot run it.

    ATen picks a build the CPU runs unless ATEN_CPU_CAPABILITY forces one,
    and it does not lower a forced one: its own kernels, and fuseops' if
    they followed, would die of an illegal instruction at the first op.
    """
    if runs:
        return
    forced = os.environ.get("ATEN_CPU_CAPABILITY", "")
    lower = [cap.lower() for cap in ("DEFAULT", "AVX2") if cpu_runs(cap)]
    raise UnsupportedCpuError(
        f"fuseops: PyTorch is set to run its {aten_capability} CPU kernels "
        f"(ATEN_CPU_CAPABILITY={forced!r}), but this CPU does not support "
        f"{aten_capability}: the first op would crash with an illegal instruction. "
        f"Unset ATEN_CPU_CAPABILITY to let PyTorch and fuseops pick what this CPU runs, "
        f"or set it to one of: {', '.join(lower)}."
    )


def load() -> None:
    try:
        from . import _build_config
    except ImportError as error:
        # The source tree's python/fuseops has no _build_config.py (CMake
        # writes it into the build) and no library.
        raise ImportError(
            f"fuseops is not built: {_PACKAGE_DIR} has no _build_config.py ({error}). "
            f"This looks like the source tree rather than an installed fuseops; build and "
            f"install it into this environment with `pip install --no-build-isolation .` "
            f'from the source folder (README, "Quick start"), and import it from elsewhere.'
        ) from error

    check_torch_version(_build_config.TORCH_VERSION, torch.__version__)
    aten_capability = torch.backends.cpu.get_cpu_capability()
    check_cpu_capability(aten_capability, cpu_runs(aten_capability))
    if not os.path.exists(LIBRARY_PATH):
        raise ImportError(
            f"fuseops: its C++ library {LIBRARY_PATH} is missing (a damaged or partial "
            f"install). Reinstall fuseops:\n    {_REINSTALL}"
        )
    try:
        torch.ops.load_library(LIBRARY_PATH)
    except OSError as error:
        raise ImportError(
            f"fuseops: cannot load its C++ library {LIBRARY_PATH}: {error}\n"
            f"The file is damaged or was built for another system or torch. Reinstall "
            f"fuseops in this environment:\n    {_REINSTALL}"
        ) from error
