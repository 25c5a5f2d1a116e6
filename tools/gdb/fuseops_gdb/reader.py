"""Reading a c10::TensorImpl, and the elements of its storage, from memory.

Only memory is read -- no function of the inspected program is called -- so
everything here works on a core file as well as on a live process.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

import gdb

from ._layout import (
    Invalid,
    address_of,
    deref,
    is_incomplete,
    lookup_type,
    member,
    optional_of,
    pointer_of,
    read_memory,
)
from .decode import DType, SymIntValue, device_name, dtype_from_index, read_symint, scalar_type_name

# More dimensions than this is garbage, not a tensor (torch allows 64).
MAX_DIMS = 64
# One read covers the whole view when its span is at most this many bytes;
# otherwise each shown element is read on its own.
_SPAN_READ_LIMIT = 1 << 20


def _small_vector_items(vector: gdb.Value, element_type: gdb.Type, limit: int) -> list[gdb.Value]:
    size = int(member(vector, "Size"))
    if size > limit:
        raise Invalid(f"{size} elements")
    begin = member(vector, "BeginX").cast(element_type.pointer())
    return [begin[i] for i in range(size)]


@dataclass
class TensorInfo:
    undefined: bool = False
    dtype: DType | None = None
    sizes: list = field(default_factory=list)  # ints, or SymIntValue when symbolic
    strides: list = field(default_factory=list)
    storage_offset: object = 0
    device: str = "?"
    symbolic: bool = False
    requires_grad: bool | None = False  # None: unknown, no layout of AutogradMeta
    grad: gdb.Value | None = None  # c10::TensorImpl* of a defined .grad
    data: int = 0  # address of the storage's first byte
    storage_bytes: int | None = None
    no_values: str | None = None  # why the values cannot be shown

    @property
    def numel(self) -> int | None:
        if self.symbolic:
            return None
        return math.prod(self.sizes)

    def is_contiguous(self) -> bool | None:
        expected = 1
        for size, stride in zip(reversed(self.sizes), reversed(self.strides)):
            if isinstance(size, SymIntValue) or isinstance(stride, SymIntValue):
                if isinstance(size, SymIntValue) and size.value is None:
                    return None
                size = size.value if isinstance(size, SymIntValue) else size
                stride = stride.value if isinstance(stride, SymIntValue) else stride
                if stride is None:
                    return None
            if size == 0:
                return True
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True


def _sizes_and_strides(impl: gdb.Value) -> tuple[list[int], list[int]]:
    holder = member(impl, "sizes_and_strides_")
    ndim = int(member(holder, "size_"))
    if ndim > MAX_DIMS:
        raise Invalid(f"{ndim} dimensions")
    inline = member(holder, "inlineStorage_")
    low, high = inline.type.strip_typedefs().range()
    max_inline = (high - low + 1) // 2
    if ndim <= max_inline:
        sizes = [int(inline[i]) for i in range(ndim)]
        strides = [int(inline[max_inline + i]) for i in range(ndim)]
    else:
        storage = address_of(member(holder, "outOfLineStorage_"))
        raw = read_memory(storage, 16 * ndim)
        values = struct.unpack(f"<{2 * ndim}q", raw)
        sizes, strides = list(values[:ndim]), list(values[ndim:])
    return sizes, strides


def _symbolic_shape(impl: gdb.Value, info: TensorInfo) -> None:
    extra = pointer_of(member(impl, "extra_meta_"))
    if address_of(extra) == 0:
        raise Invalid("symbolic sizes without their metadata")
    meta = pointer_of(member(deref(extra), "symbolic_shape_meta_"))
    if address_of(meta) == 0:
        raise Invalid("symbolic sizes without their metadata")
    meta = deref(meta)
    symint = lookup_type("c10::SymInt")
    info.sizes = [
        read_symint(v) for v in _small_vector_items(member(meta, "sizes_"), symint, MAX_DIMS)
    ]
    info.strides = [
        read_symint(v) for v in _small_vector_items(member(meta, "strides_"), symint, MAX_DIMS)
    ]
    info.storage_offset = read_symint(member(meta, "storage_offset_"))
    if len(info.sizes) != len(info.strides):
        raise Invalid(f"{len(info.sizes)} sizes but {len(info.strides)} strides")


# What the printers read of each class whose layout only a types object
# provides; `fuseops-load-types` checks that all of it is described.
LAYOUTS = {
    "c10::TensorImpl": (
        "data_type_",
        "device_opt_",
        "has_symbolic_sizes_strides_",
        "sizes_and_strides_",
        "storage_offset_",
        "numel_",
        "autograd_meta_",
        "storage_access_should_throw_",
        "storage_",
        "extra_meta_",
    ),
    "c10::StorageImpl": ("data_ptr_", "size_bytes_"),
    "torch::autograd::AutogradMeta": ("requires_grad_", "grad_fn_", "grad_"),
}

_singleton_address: int | None = None


def _undefined_singleton() -> int | None:
    """The address of c10::UndefinedTensorImpl::_singleton, which every
    undefined tensor points at. Its symbol needs no layout, so an undefined
    tensor is recognised even where c10::TensorImpl is only declared."""
    global _singleton_address
    if _singleton_address is None:
        try:
            _singleton_address = int(gdb.parse_and_eval("&'c10::UndefinedTensorImpl::_singleton'"))
        except gdb.error:
            return None
    return _singleton_address


def clear_caches(*_args) -> None:
    global _singleton_address
    _singleton_address = None


def _read_autograd(impl: gdb.Value, info: TensorInfo) -> None:
    meta = pointer_of(member(impl, "autograd_meta_"))
    if address_of(meta) == 0:
        return
    # torch::autograd::AutogradMeta is the only implementation of the
    # interface in torch; read it as that. Without its layout, only what it
    # holds is unknown.
    try:
        autograd_type = gdb.lookup_type("torch::autograd::AutogradMeta")
    except gdb.error:
        autograd_type = None
    if autograd_type is None or is_incomplete(autograd_type):
        info.requires_grad = None
        return
    autograd_meta = deref(meta, autograd_type)
    info.requires_grad = bool(member(autograd_meta, "requires_grad_")) or (
        address_of(pointer_of(member(autograd_meta, "grad_fn_"))) != 0
    )
    grad = pointer_of(member(member(autograd_meta, "grad_"), "impl_"))
    if address_of(grad) not in (0, _undefined_singleton()):
        info.grad = grad


def read_tensor(pointer: gdb.Value) -> TensorInfo:
    """Reads the c10::TensorImpl that `pointer` points at into a TensorInfo.

    Raises Invalid for garbage, gdb.MemoryError for unreadable metadata and
    LayoutError when the debug information lacks a field.
    """
    if address_of(pointer) == _undefined_singleton():
        return TensorInfo(undefined=True)
    impl = deref(pointer)
    info = TensorInfo()
    dtype_index = int(member(member(impl, "data_type_"), "index_"))
    device = optional_of(member(impl, "device_opt_"))
    if device is None and scalar_type_name(dtype_index) == "Undefined":
        # c10::UndefinedTensorImpl, the only tensor without dtype and device.
        info.undefined = True
        return info
    info.dtype = dtype_from_index(dtype_index)

    info.symbolic = bool(member(impl, "has_symbolic_sizes_strides_"))
    if info.symbolic:
        _symbolic_shape(impl, info)
    else:
        info.sizes, info.strides = _sizes_and_strides(impl)
        info.storage_offset = int(member(impl, "storage_offset_"))
        if any(size < 0 for size in info.sizes):
            raise Invalid(f"negative size in {info.sizes}")
        if info.storage_offset < 0:
            raise Invalid(f"storage offset {info.storage_offset}")
        numel = int(member(impl, "numel_"))
        if numel != math.prod(info.sizes):
            raise Invalid(f"{numel} elements for sizes {info.sizes}")

    info.device = device_name(device) if device is not None else "no device"
    _read_autograd(impl, info)

    if info.symbolic:
        info.no_values = "symbolic sizes"
        return info
    if info.device.startswith("meta"):
        info.no_values = "a meta tensor has no data"
        return info
    if not info.device.startswith("cpu"):
        info.no_values = f"{info.device} memory is not readable from gdb"
        return info
    if bool(member(impl, "storage_access_should_throw_")):
        info.no_values = "this tensor has no accessible storage"
        return info
    storage = pointer_of(member(member(impl, "storage_"), "storage_impl_"))
    if address_of(storage) == 0:
        info.no_values = "no storage"
        return info
    storage = deref(storage)
    data_ptr = member(storage, "data_ptr_")
    info.data = address_of(member(member(data_ptr, "ptr_"), "data_"))
    size_bytes = read_symint(member(storage, "size_bytes_"))
    info.storage_bytes = size_bytes.value
    if info.dtype.decode is None:
        info.no_values = f"values of dtype {info.dtype.name} are not decoded"
    elif info.data == 0 and info.numel:
        info.no_values = "the storage has no data pointer"
    return info


def read_elements(
    info: TensorInfo, indices: list[tuple[int, ...]]
) -> dict[tuple[int, ...], object]:
    """The decoded values of the elements at `indices` of a strided tensor.

    Raises Invalid when the view reaches outside its storage and
    gdb.MemoryError when the data cannot be read.
    """
    item = info.dtype.item_size
    offsets = {}
    for index in indices:
        element = info.storage_offset + sum(i * s for i, s in zip(index, info.strides))
        offsets[index] = element * item
    if not offsets:
        return {}
    low = min(offsets.values())
    high = max(offsets.values()) + item
    if low < 0 or (info.storage_bytes is not None and high > info.storage_bytes):
        raise Invalid(f"its view reaches outside its storage of {info.storage_bytes} bytes")
    if high - low <= _SPAN_READ_LIMIT:
        span = read_memory(info.data + low, high - low)
        raw = {index: span[off - low : off - low + item] for index, off in offsets.items()}
    else:
        raw = {index: read_memory(info.data + off, item) for index, off in offsets.items()}
    return {index: info.dtype.decode(chunk) for index, chunk in raw.items()}
