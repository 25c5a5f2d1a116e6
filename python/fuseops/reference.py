"""Plain-PyTorch reference implementations of every fuseops op.

Tests compare fuseops against these, and the benchmark times them (eager and
under torch.compile) as the peers fuseops must beat. They favour clarity over
speed and compute in the input dtype, as user code would.

Each is defined in its op's module (``fuseops.ops.<module>.<op>_reference``)
and collected here as ``fuseops.reference.<op>``.
"""

from __future__ import annotations

from . import ops as _ops

_references = _ops.exported("references")
globals().update(_references)

__all__ = sorted(_references)
