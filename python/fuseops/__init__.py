"""fuseops: fused, fast PyTorch operators with CPU and CUDA kernels.

Every public op calls ``torch.ops.fuseops.<name>``, so ``torch.compile``,
``torch.export``, ``torch.jit.trace`` and the profiler see it as one op.
"""

from __future__ import annotations

import os as _os

from . import _loader

_loader.load()

from . import _C  # noqa: E402  (needs the library loaded first)
from . import cpu, nn, reference  # noqa: E402
from ._build_config import FUSEOPS_VERSION as __version__  # noqa: E402
from . import ops as _ops  # noqa: E402

# Every op module's public wrappers, found by fuseops.ops (no list here).
globals().update(_ops.exported("ops"))

#: Folder to add to CMAKE_PREFIX_PATH so that ``find_package(fuseops)`` finds
#: this installation (like ``torch.utils.cmake_prefix_path``).
cmake_prefix_path = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "share", "cmake")

#: The installed C++ headers and library.
include_dir = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "include")
library_path = _loader.LIBRARY_PATH


def build_info() -> dict:
    """How this fuseops was built: versions, C++ ABI, CPU capabilities, CUDA."""
    return _C.build_info()


__all__ = sorted(
    [
        "__version__",
        "build_info",
        "cmake_prefix_path",
        "cpu",
        "include_dir",
        "library_path",
        "nn",
        "reference",
    ]
    + list(_ops.exported("ops"))
)
