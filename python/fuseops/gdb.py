"""Where the gdb printers of this fuseops install live, and how to load them.

`python -m fuseops gdb-init` prints gdb_init_lines(): lines for ~/.gdbinit.
"""

from __future__ import annotations

import os

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def printers_dir() -> str:
    """The folder holding fuseops-gdb.py and the fuseops_gdb package.

    Installed (wheel): <package>/share/gdb. Running from a source checkout:
    <checkout>/tools/gdb.
    """
    candidates = [
        os.path.join(_PACKAGE_DIR, "share", "gdb"),
        os.path.normpath(os.path.join(_PACKAGE_DIR, "..", "..", "tools", "gdb")),
    ]
    for candidate in candidates:
        if os.path.isfile(os.path.join(candidate, "fuseops-gdb.py")):
            return candidate
    raise FileNotFoundError(
        "fuseops: the gdb printers are not installed (looked in "
        + ", ".join(candidates)
        + "); reinstall fuseops"
    )


def library_dir() -> str:
    return os.path.join(_PACKAGE_DIR, "lib")


def gdb_init_lines() -> list[str]:
    """Lines to append to ~/.gdbinit so gdb loads the fuseops printers.

    The active line sources the printers in every gdb session; the commented
    alternative lets gdb load them only for programs that load libfuseops
    (through the -gdb.py script installed beside the library).
    """
    printers = printers_dir()
    lines = [
        "# fuseops gdb printers: at::Tensor, c10::TensorImpl, IntArrayRef, ... (see "
        + os.path.join(printers, "README.md")
        + ")",
        "source " + os.path.join(printers, "fuseops-gdb.py"),
        "# tensors print '<... has no layout ...>' in a program without torch's class"
        " layouts (as a pip install's is): run `fuseops-load-types` in gdb",
    ]
    if os.path.isdir(library_dir()):
        lines += [
            "# or, instead of the line above, load them when a program loads libfuseops:",
            "# add-auto-load-safe-path " + library_dir(),
        ]
    return lines
