"""Memory settings for PyTorch programs on CPU, and fuseops' output allocator.

Large fresh tensors are slow on CPU for a reason that has nothing to do with
arithmetic: glibc maps each large block anew and returns it to the system on
free, so the first write to every 4 KiB page of a new tensor faults into the
kernel, which zeroes the page. Writing a new 64 MiB result costs several
times what writing into an existing tensor costs.

fuseops' own large outputs (2 MiB and up) come from an allocator of its own,
2 MiB aligned, which can mark them ``MADV_HUGEPAGE`` (one fault per 2 MiB
where the system allows transparent huge pages) and keep freed blocks for
reuse. Both are off by default: with the common ``defrag=madvise`` setting a
huge-page fault compacts memory synchronously when no free huge page is at
hand, which can cost more than the faults it saves, and a cache keeps memory.

:func:`tune_memory` turns them on, for the whole process, at the price of
memory kept: freed memory is kept for reuse instead of being returned to the
system, by glibc for every PyTorch tensor and by fuseops' cache for its
outputs, whose blocks are huge pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Optional

from . import _C

__all__ = [
    "default_keep_bytes",
    "output_memory_stats",
    "release_memory",
    "set_output_cache_limit",
    "set_output_huge_pages",
    "tune_memory",
]

# mallopt parameters (glibc <malloc.h>).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc's own defaults, restored by tune_memory(keep_bytes=0).
_GLIBC_DEFAULT_THRESHOLD = 128 * 1024


def output_memory_stats() -> dict:
    """Counters of fuseops' output allocator: blocks handed out, cache hits,
    mappings marked for huge pages, bytes in use, bytes cached, cache limit."""
    return _C.output_memory_stats()


def set_output_cache_limit(nbytes: int) -> None:
    """Keep up to ``nbytes`` of freed fuseops outputs for reuse (0: off, the
    default). Blocks above a new, lower limit are returned at once."""
    _C.set_output_cache_limit(int(nbytes))


def set_output_huge_pages(enabled: bool) -> None:
    """Mark new large output blocks ``MADV_HUGEPAGE`` (default off; see the
    module's documentation for why)."""
    _C.set_output_huge_pages(bool(enabled))


def _glibc() -> Optional[ctypes.CDLL]:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return None  # not glibc (e.g. musl): its malloc has other knobs
    return libc


def release_memory() -> None:
    """Return kept memory to the system: fuseops' cached output blocks, and
    glibc's free heap memory (``malloc_trim``)."""
    _C.release_cached_output_memory()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def default_keep_bytes() -> int:
    """What :func:`tune_memory` keeps unless told: 1/8 of physical memory,
    at most 4 GiB."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(physical // 8, 4 << 30)


def tune_memory(keep_bytes: Optional[int] = None) -> dict:
    """Keep freed memory for reuse, process-wide, so that large new tensors
    (PyTorch's and fuseops') cost no page faults.

    - glibc: allocations up to ``keep_bytes`` come from the heap instead of a
      fresh mapping (``M_MMAP_THRESHOLD``), and up to ``keep_bytes`` of free
      heap is kept instead of being returned (``M_TRIM_THRESHOLD``). This is
      what ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` in the
      environment would do, applied after start-up.
    - fuseops: its cache of freed output blocks is bounded by ``keep_bytes``,
      and new blocks are marked for transparent huge pages (a block's
      compaction cost is paid once, then the block is reused).

    The cost is memory: the process keeps up to about ``keep_bytes`` (twice,
    counting both) it has freed, so its resident size stays near its peak.
    ``keep_bytes`` defaults to :func:`default_keep_bytes`; ``keep_bytes=0``
    goes back to glibc's default thresholds (its dynamic adjustment of them
    stays off) and turns fuseops' cache and huge pages off. :func:`release_memory` returns
    what is kept without changing the settings.

    Returns what it applied: ``{"keep_bytes", "glibc", "output_cache_limit"}``
    (``glibc`` False where the C library is not glibc and only fuseops' cache
    was set).
    """
    if keep_bytes is None:
        keep_bytes = default_keep_bytes()
    keep_bytes = int(keep_bytes)
    if keep_bytes < 0:
        raise ValueError(f"fuseops.cpu.tune_memory: keep_bytes must be >= 0, got {keep_bytes}")
    # mallopt takes an int.
    threshold = min(keep_bytes, 2**31 - 1) if keep_bytes > 0 else _GLIBC_DEFAULT_THRESHOLD
    libc = _glibc()
    glibc_applied = False
    if libc is not None:
        glibc_applied = bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, threshold)
        )
    set_output_cache_limit(keep_bytes)
    set_output_huge_pages(keep_bytes > 0)
    return {"keep_bytes": keep_bytes, "glibc": glibc_applied, "output_cache_limit": keep_bytes}
