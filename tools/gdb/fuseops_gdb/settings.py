"""`set fuseops-max-elements N` / `show fuseops-max-elements`."""

from __future__ import annotations

import gdb

DEFAULT_MAX_ELEMENTS = 20

_parameter = None


class MaxElementsParameter(gdb.Parameter):
    """How many values the fuseops printers show of one tensor before they
    elide the middle of each dimension, like torch does ("..."). 0 or
    "unlimited" shows all values."""

    set_doc = "Set how many values the fuseops tensor printers show."
    show_doc = "Show how many values the fuseops tensor printers show."

    def __init__(self):
        super().__init__("fuseops-max-elements", gdb.COMMAND_DATA, gdb.PARAM_UINTEGER)
        self.value = DEFAULT_MAX_ELEMENTS

    def get_set_string(self) -> str:
        return ""

    def get_show_string(self, svalue: str) -> str:
        return f"The fuseops tensor printers show at most {svalue} values of a tensor."


def install() -> None:
    global _parameter
    if _parameter is None:
        _parameter = MaxElementsParameter()


def max_elements() -> int | None:
    """The limit, or None for unlimited."""
    if _parameter is None:
        return DEFAULT_MAX_ELEMENTS
    value = _parameter.value
    return None if value is None or value == 0 else int(value)
