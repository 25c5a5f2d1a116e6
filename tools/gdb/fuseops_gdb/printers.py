"""The pretty-printers: one class per printed type, one collection "fuseops".

`info pretty-printer` lists the collection and its printers;
`disable pretty-printer global fuseops` (or `...fuseops;at::Tensor`) turns
them off.
"""

from __future__ import annotations

import re

import gdb
import gdb.printing

from . import settings
from ._layout import (
    Invalid,
    LayoutError,
    address_of,
    deref,
    enumerators,
    member,
    pointer_of,
    type_name,
)
from .decode import SCALAR_TYPES, device_name, read_symint, type_meta_dtype
from .formatting import format_tensor, safe
from .reader import read_tensor


def impl_of_tensor(tensor: gdb.Value) -> gdb.Value:
    """The c10::TensorImpl* of an at::Tensor or at::TensorBase."""
    return pointer_of(member(tensor, "impl_"))


def tensor_text(
    kind: str, impl_pointer: gdb.Value, limit: int | None, with_values: bool = True
) -> str:
    def action() -> str:
        if address_of(impl_pointer) == 0:
            return f"{kind} nullptr"
        info = read_tensor(impl_pointer)
        return format_tensor(kind, info, limit, with_values)

    return safe(kind, action)


class Printer:
    """Base of the printers: gdb makes one per printed value."""

    def __init__(self, value: gdb.Value):
        self.value = value


class TensorPrinter(Printer):
    """at::Tensor and at::TensorBase: metadata, then the values.

    Tensor float32 [2, 3] cpu
    [[0., 1., 2.],
     [3., 4., 5.]]
    """

    def to_string(self) -> str:
        return safe(
            "at::Tensor",
            lambda: tensor_text("Tensor", impl_of_tensor(self.value), settings.max_elements()),
        )


class TensorImplPrinter(Printer):
    """c10::TensorImpl (the object itself): as a tensor, values included."""

    def to_string(self) -> str:
        return safe(
            "c10::TensorImpl",
            lambda: tensor_text("TensorImpl", self.value.address, settings.max_elements()),
        )


class TensorImplPointerPrinter(Printer):
    """c10::TensorImpl* and c10::intrusive_ptr<c10::TensorImpl>: the address
    and one line of metadata, no values (they appear in backtraces and
    structures); `print *p` shows the values."""

    def to_string(self) -> str:
        def action() -> str:
            pointer = pointer_of(self.value)
            address = address_of(pointer)
            if address == 0:
                return "nullptr"
            return f"0x{address:x} -> " + tensor_text(
                "TensorImpl", pointer, None, with_values=False
            )

        return safe("c10::TensorImpl pointer", action)


class ArrayRefPrinter(Printer):
    """c10::ArrayRef<T> (IntArrayRef, SymIntArrayRef, ...): its elements."""

    def _data_and_length(self):
        return member(self.value, "Data"), int(member(self.value, "Length"))

    def to_string(self) -> str:
        return safe(
            "c10::ArrayRef", lambda: f"c10::ArrayRef of length {self._data_and_length()[1]}"
        )

    def children(self):
        try:
            data, length = self._data_and_length()
        except (gdb.error, LayoutError, Invalid):
            return
        # gdb stops asking after `print elements` children: garbage lengths
        # cost nothing.
        for i in range(length):
            yield f"[{i}]", data[i]

    def display_hint(self) -> str:
        return "array"


class SmallVectorPrinter(Printer):
    """c10::SmallVector<T, N> and c10::SmallVectorImpl<T>: size, capacity, elements."""

    def _element_type(self) -> gdb.Type:
        return self.value.type.strip_typedefs().template_argument(0)

    def to_string(self) -> str:
        def action() -> str:
            size = int(member(self.value, "Size"))
            capacity = int(member(self.value, "Capacity"))
            if size > capacity:
                raise Invalid(f"size {size} above capacity {capacity}")
            return f"c10::SmallVector of length {size}, capacity {capacity}"

        return safe("c10::SmallVector", action)

    def children(self):
        try:
            size = int(member(self.value, "Size"))
            capacity = int(member(self.value, "Capacity"))
            if size > capacity:
                return
            begin = member(self.value, "BeginX").cast(self._element_type().pointer())
        except (gdb.error, LayoutError, Invalid):
            return
        for i in range(size):
            yield f"[{i}]", begin[i]

    def display_hint(self) -> str:
        return "array"


class ScalarTypePrinter(Printer):
    """c10::ScalarType: the enumerator and torch's dtype name, e.g. "BFloat16 (bfloat16)"."""

    def to_string(self) -> str:
        def action() -> str:
            index = int(self.value)
            name = enumerators(self.value.type).get(index)
            if name is None:
                raise Invalid(f"value {index}")
            return f"{name} ({SCALAR_TYPES.get(name, (name.lower(), None))[0]})"

        return safe("c10::ScalarType", action)


class TypeMetaPrinter(Printer):
    """caffe2::TypeMeta: the dtype name for scalar types, else its index."""

    def to_string(self) -> str:
        def action() -> str:
            dtype = type_meta_dtype(self.value)
            if dtype is None:
                return f"caffe2::TypeMeta #{int(member(self.value, 'index_'))} (not a scalar type)"
            return dtype.name

        return safe("caffe2::TypeMeta", action)


class DevicePrinter(Printer):
    """c10::Device: "cpu", "cuda:1", ... as torch writes it."""

    def to_string(self) -> str:
        return safe("c10::Device", lambda: device_name(self.value))


class SymIntPrinter(Printer):
    """c10::SymInt: the integer, or that it is symbolic (a node's expression
    lives in Python or behind virtual calls, out of reach of a core file)."""

    def to_string(self) -> str:
        def action() -> str:
            symint = read_symint(self.value)
            if symint.value is None:
                return f"<symbolic SymInt, node 0x{symint.node:x}>"
            return str(symint.value)

        return safe("c10::SymInt", action)


class StoragePrinter(Printer):
    """c10::Storage: size in bytes, device and data address."""

    def to_string(self) -> str:
        def action() -> str:
            pointer = pointer_of(member(self.value, "storage_impl_"))
            if address_of(pointer) == 0:
                return "Storage nullptr"
            impl = deref(pointer)
            data_ptr = member(impl, "data_ptr_")
            size = read_symint(member(impl, "size_bytes_"))
            data = address_of(member(member(data_ptr, "ptr_"), "data_"))
            device = device_name(member(data_ptr, "device_"))
            return f"Storage of {size} bytes on {device} at 0x{data:x}"

        return safe("c10::Storage", action)


class FuseopsPrinters(gdb.printing.PrettyPrinter):
    """The "fuseops" collection: matches by type name, after typedefs and
    references, so IntArrayRef and at::Tensor& are covered."""

    def __init__(self):
        super().__init__("fuseops", [])
        self._by_name = {}
        self._by_regex = []
        for name, cls in (
            ("at::Tensor", TensorPrinter),
            ("at::TensorBase", TensorPrinter),
            ("c10::TensorImpl", TensorImplPrinter),
            ("c10::UndefinedTensorImpl", TensorImplPrinter),
            ("c10::TensorImpl *", TensorImplPointerPrinter),
            ("c10::ScalarType", ScalarTypePrinter),
            ("caffe2::TypeMeta", TypeMetaPrinter),
            ("c10::Device", DevicePrinter),
            ("c10::SymInt", SymIntPrinter),
            ("c10::Storage", StoragePrinter),
        ):
            self._add(name, cls, exact=True)
        for pattern, cls in (
            (r"^c10::intrusive_ptr<c10::TensorImpl,", TensorImplPointerPrinter),
            (r"^c10::ArrayRef<", ArrayRefPrinter),
            (r"^c10::SmallVector(Impl)?<", SmallVectorPrinter),
        ):
            self._add(pattern, cls, exact=False)

    def _add(self, name: str, cls, exact: bool) -> None:
        subprinter = gdb.printing.SubPrettyPrinter(name)
        self.subprinters.append(subprinter)
        if exact:
            self._by_name[name] = (subprinter, cls)
        else:
            self._by_regex.append((re.compile(name), subprinter, cls))

    def __call__(self, value: gdb.Value):
        if not self.enabled:
            return None
        name = type_name(value)
        found = self._by_name.get(name)
        if found is not None:
            return found[1](value) if found[0].enabled else None
        if name.startswith("c10::"):
            for regex, subprinter, cls in self._by_regex:
                if subprinter.enabled and regex.match(name):
                    return cls(value)
        return None


def build_collection() -> FuseopsPrinters:
    return FuseopsPrinters()
