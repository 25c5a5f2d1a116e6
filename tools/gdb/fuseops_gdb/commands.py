"""gdb commands: `fuseops-tensor [-grad] EXPR [N]` and `fuseops-load-types [FILE]`."""

from __future__ import annotations

import os
import struct

import gdb

from . import settings
from ._layout import README, LayoutError, missing_layout, optional_of, pointer_of, type_name
from .formatting import safe
from .printers import impl_of_tensor, tensor_text
from .reader import LAYOUTS, read_tensor

_types_object: str | None = None


def set_types_object(path: str | None) -> None:
    global _types_object
    if path:
        _types_object = path


def _impl_pointer(value: gdb.Value) -> gdb.Value:
    """The c10::TensorImpl* behind anything that holds a tensor."""
    if value.type.code in (gdb.TYPE_CODE_REF, gdb.TYPE_CODE_RVALUE_REF):
        value = value.referenced_value()
    name = type_name(value)
    if name.startswith("std::optional<"):
        contained = optional_of(value)
        if contained is None:
            raise gdb.GdbError("the optional holds no tensor")
        return _impl_pointer(contained)
    if name in ("at::Tensor", "at::TensorBase"):
        return impl_of_tensor(value)
    if name in ("c10::TensorImpl", "c10::UndefinedTensorImpl"):
        return value.address
    if name.startswith("c10::intrusive_ptr<c10::TensorImpl"):
        return pointer_of(value)
    if value.type.strip_typedefs().code == gdb.TYPE_CODE_PTR:
        target = value.type.strip_typedefs().target().unqualified().strip_typedefs()
        if str(target) in ("at::Tensor", "at::TensorBase"):
            return impl_of_tensor(value.dereference())
        if str(target) in ("c10::TensorImpl", "c10::UndefinedTensorImpl"):
            return value
    raise gdb.GdbError(f"fuseops-tensor: {name} is not a tensor")


class TensorCommand(gdb.Command):
    """Print a tensor with up to N values.

    Usage: fuseops-tensor [-grad] EXPR [N]
    EXPR is an at::Tensor, at::TensorBase, c10::TensorImpl, a pointer or
    c10::intrusive_ptr to one, or a std::optional<at::Tensor>. N (default: the
    setting fuseops-max-elements) is how many values are shown before the middle
    of each dimension is elided; 0 shows all. -grad prints the tensor's .grad
    instead (read from memory, so it works on a core file too)."""

    def __init__(self):
        super().__init__("fuseops-tensor", gdb.COMMAND_DATA, gdb.COMPLETE_EXPRESSION)

    def invoke(self, argument: str, from_tty: bool) -> None:
        argument = argument.strip()
        if not argument:
            raise gdb.GdbError("usage: fuseops-tensor [-grad] EXPR [N]")
        grad = argument.startswith("-grad ")
        if grad:
            argument = argument[len("-grad ") :].strip()
        limit = settings.max_elements()
        parts = argument.rsplit(None, 1)
        if len(parts) == 2 and parts[1].isdigit():
            argument = parts[0]
            limit = int(parts[1]) or None
        pointer = _impl_pointer(gdb.parse_and_eval(argument))

        def text() -> str:
            if not grad:
                return tensor_text("Tensor", pointer, limit)
            info = read_tensor(pointer)
            if info.requires_grad is None:
                raise LayoutError(
                    "the grad is unknown: torch::autograd::AutogradMeta has no layout; run "
                    f'`fuseops-load-types` (see {README}, "Type information")'
                )
            # No autograd metadata, or an undefined grad: torch's `.grad is None`.
            return (
                "Tensor undefined" if info.grad is None else tensor_text("Tensor", info.grad, limit)
            )

        gdb.write(safe("tensor", text) + "\n")


def _has_debug_info(path: str) -> bool:
    """Whether the ELF file at `path` has a .debug_info section (a stripped
    one has none, and gdb adds its symbols without complaint)."""
    with open(path, "rb") as file:
        data = file.read()
    if data[:5] != b"\x7fELF\x02":
        return True  # not a 64-bit ELF file: let gdb judge it
    (section_headers,) = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    (names,) = struct.unpack_from("<Q", data, section_headers + names_index * entry_size + 0x18)
    for index in range(count):
        (name,) = struct.unpack_from("<I", data, section_headers + index * entry_size)
        start = names + name
        if data[start : data.index(b"\0", start)] == b".debug_info":
            return True
    return False


class LoadTypesCommand(gdb.Command):
    """Load the layout of torch's tensor classes for the fuseops printers.

    Usage: fuseops-load-types [FILE]
    For programs whose debug information only declares c10::TensorImpl and
    friends (the printers then say so): adds the symbols of fuseops_gdb_types.so,
    which ships with the printers, or of FILE."""

    def __init__(self):
        super().__init__("fuseops-load-types", gdb.COMMAND_FILES, gdb.COMPLETE_FILENAME)

    def invoke(self, argument: str, from_tty: bool) -> None:
        path = argument.strip() or _types_object
        if not path or not os.path.exists(path):
            raise gdb.GdbError(
                f"fuseops-load-types: no types object at {path!r}; pass the path "
                "of fuseops_gdb_types.so (installed beside the printers)"
            )
        # Adding symbols resets the frame selection; keep the user's frame
        # (Frame.select, unlike the `frame` command, prints nothing).
        try:
            level = gdb.selected_frame().level()
        except gdb.error:
            level = None
        gdb.execute(f"with confirm off -- add-symbol-file {path}", to_string=True)
        if level:
            frame = gdb.newest_frame()
            for _ in range(level):
                frame = frame.older()
            frame.select()
        missing = [
            text for name, fields in LAYOUTS.items() if (text := missing_layout(name, fields))
        ]
        if missing:
            stripped = "" if _has_debug_info(path) else " (it has no debug information: stripped)"
            raise gdb.GdbError(
                f"fuseops-load-types: added the symbols of {path}{stripped}, but the printers "
                "still lack the layout of " + "; ".join(missing)
            )
        gdb.write(f"fuseops: loaded the torch type layouts from {path}\n")


_installed = False


def install() -> None:
    global _installed
    if not _installed:
        TensorCommand()
        LoadTypesCommand()
        _installed = True
