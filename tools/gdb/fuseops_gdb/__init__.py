"""gdb pretty-printers for torch tensors and friends, by fuseops.

They read memory only -- nothing in the inspected program is called -- so
they work in a live process, on a core file and in optimized builds. See
README.md beside this package for loading and for the limits.
"""

from __future__ import annotations

import gdb
import gdb.printing

from . import _layout, commands, reader, settings
from .printers import build_collection

_collection = None


def register(objfile=None, types_object: str | None = None) -> None:
    """Registers the "fuseops" printer collection (once per gdb), the
    fuseops-tensor and fuseops-load-types commands and the
    fuseops-max-elements setting. `objfile` is accepted for symmetry with
    other printer packages; the collection is always global, so one
    registration covers every program and library."""
    global _collection
    commands.set_types_object(types_object)
    if _collection is not None:
        return
    _collection = build_collection()
    gdb.printing.register_pretty_printer(None, _collection, replace=True)
    settings.install()
    commands.install()
    for clear in (_layout.clear_caches, reader.clear_caches):
        gdb.events.new_objfile.connect(clear)
        gdb.events.clear_objfiles.connect(clear)
