# Loads the fuseops gdb printers: `source /path/to/fuseops-gdb.py` (in
# ~/.gdbinit, or at the gdb prompt). See README.md beside this file.
import os
import sys


def _fuseops_gdb_source():
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import fuseops_gdb

    types_object = os.path.join(here, "fuseops_gdb_types.so")
    fuseops_gdb.register(types_object=types_object if os.path.exists(types_object) else None)


_fuseops_gdb_source()
del _fuseops_gdb_source
