"""fuseops: fused, fast PyTorch operators with CPU and CUDA kernels.

Every public op calls ``torch.ops.fuseops.<name>``, so ``torch.compile``,
``torch.export``, ``torch.jit.trace`` and the profiler see it as one op.
"""

from __future__ import annotations

import os as _os

from . import _loader

_loader.load()

from . import _C  # noqa: E402  (needs the library loaded first)
from . import nn, reference  # noqa: E402
from ._build_config import FUSEOPS_VERSION as __version__  # noqa: E402
from .ops import bias_gelu, bias_gelu_backward, gelu, gelu_backward  # noqa: E402
from .ops import geglu, geglu_backward, silu, silu_backward  # noqa: E402
from .ops import swiglu, swiglu_backward  # noqa: E402
from .ops import layer_norm, layer_norm_backward, layer_norm_forward  # noqa: E402
from .ops import relu, relu_backward  # noqa: E402
from .ops import fused_add_rms_norm, fused_add_rms_norm_backward  # noqa: E402
from .ops import fused_add_rms_norm_forward, rms_norm, rms_norm_backward  # noqa: E402
from .ops import rms_norm_forward  # noqa: E402

#: Folder to add to CMAKE_PREFIX_PATH so that ``find_package(fuseops)`` finds
#: this installation (like ``torch.utils.cmake_prefix_path``).
cmake_prefix_path = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "share", "cmake")

#: The installed C++ headers and library.
include_dir = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "include")
library_path = _loader.LIBRARY_PATH


def build_info() -> dict:
    """How this fuseops was built: versions, C++ ABI, CPU capabilities, CUDA."""
    return _C.build_info()


__all__ = [
    "__version__",
    "bias_gelu",
    "bias_gelu_backward",
    "build_info",
    "cmake_prefix_path",
    "fused_add_rms_norm",
    "fused_add_rms_norm_backward",
    "fused_add_rms_norm_forward",
    "geglu",
    "geglu_backward",
    "gelu",
    "gelu_backward",
    "include_dir",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_forward",
    "library_path",
    "nn",
    "reference",
    "relu",
    "relu_backward",
    "rms_norm",
    "rms_norm_backward",
    "rms_norm_forward",
    "silu",
    "silu_backward",
    "swiglu",
    "swiglu_backward",
]
