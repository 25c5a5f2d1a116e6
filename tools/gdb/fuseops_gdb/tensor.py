"""Reading a c10::TensorImpl from memory and formatting it like torch does.

Only memory is read -- no function of the inspected program is called -- so
everything here works on a core file as well as on a live process.
"""

from __future__ import annotations

import itertools
import math
import struct
from dataclasses import dataclass, field

import gdb

from ._layout import (
    Invalid,
    LayoutError,
    address_of,
    deref,
    enumerators,
    is_incomplete,
    lookup_type,
    member,
    optional_of,
    pointer_of,
    read_memory,
)

# More dimensions than this is garbage, not a tensor (torch allows 64).
MAX_DIMS = 64
# One read covers the whole view when its span is at most this many bytes;
# otherwise each shown element is read on its own.
_SPAN_READ_LIMIT = 1 << 20

# torch's name and the struct format of one element, by c10::ScalarType
# enumerator name. Formats starting with "!" are decoded by a function.
SCALAR_TYPES: dict[str, tuple[str, str | None]] = {
    "Byte": ("uint8", "B"),
    "Char": ("int8", "b"),
    "Short": ("int16", "h"),
    "Int": ("int32", "i"),
    "Long": ("int64", "q"),
    "Half": ("float16", "e"),
    "Float": ("float32", "f"),
    "Double": ("float64", "d"),
    "ComplexHalf": ("complex32", "ee"),
    "ComplexFloat": ("complex64", "ff"),
    "ComplexDouble": ("complex128", "dd"),
    "Bool": ("bool", "?"),
    "QInt8": ("qint8", "b"),
    "QUInt8": ("quint8", "B"),
    "QInt32": ("qint32", "i"),
    "BFloat16": ("bfloat16", "!bfloat16"),
    "QUInt4x2": ("quint4x2", None),
    "QUInt2x4": ("quint2x4", None),
    "Bits1x8": ("bits1x8", None),
    "Bits2x4": ("bits2x4", None),
    "Bits4x2": ("bits4x2", None),
    "Bits8": ("bits8", None),
    "Bits16": ("bits16", None),
    "Float8_e5m2": ("float8_e5m2", "!e5m2"),
    "Float8_e4m3fn": ("float8_e4m3fn", "!e4m3fn"),
    "Float8_e5m2fnuz": ("float8_e5m2fnuz", "!e5m2fnuz"),
    "Float8_e4m3fnuz": ("float8_e4m3fnuz", "!e4m3fnuz"),
    "UInt16": ("uint16", "H"),
    "UInt32": ("uint32", "I"),
    "UInt64": ("uint64", "Q"),
    "Int8": ("int8", "b"),
    "Int16": ("int16", "h"),
    "Int32": ("int32", "i"),
    "Int64": ("int64", "q"),
    "Undefined": ("undefined", None),
}

_ITEM_SIZES = {"B": 1, "b": 1, "h": 2, "H": 2, "i": 4, "I": 4, "q": 8, "Q": 8, "e": 2, "f": 4, "d": 8, "?": 1}


def _minifloat(bits: int, exponent_bits: int, mantissa_bits: int, bias: int, kind: str) -> float:
    sign = -1.0 if bits >> (exponent_bits + mantissa_bits) else 1.0
    exponent = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1)
    mantissa = bits & ((1 << mantissa_bits) - 1)
    if kind == "fnuz" and bits == 0x80:
        return math.nan
    if kind == "ieee" and exponent == (1 << exponent_bits) - 1:
        return sign * math.inf if mantissa == 0 else math.nan
    if kind == "fn" and exponent == (1 << exponent_bits) - 1 and mantissa == (1 << mantissa_bits) - 1:
        return math.nan
    if exponent == 0:
        return sign * mantissa * 2.0 ** (1 - bias - mantissa_bits)
    return sign * (1 + mantissa / (1 << mantissa_bits)) * 2.0 ** (exponent - bias)


_SPECIAL_DECODERS = {
    "!bfloat16": (2, lambda raw: struct.unpack("<f", b"\0\0" + raw)[0]),
    "!e5m2": (1, lambda raw: _minifloat(raw[0], 5, 2, 15, "ieee")),
    "!e4m3fn": (1, lambda raw: _minifloat(raw[0], 4, 3, 7, "fn")),
    "!e5m2fnuz": (1, lambda raw: _minifloat(raw[0], 5, 2, 16, "fnuz")),
    "!e4m3fnuz": (1, lambda raw: _minifloat(raw[0], 4, 3, 8, "fnuz")),
}


@dataclass
class DType:
    enumerator: str  # c10::ScalarType enumerator, e.g. "Float"
    name: str  # torch's name, e.g. "float32"
    item_size: int | None
    decode: object | None  # bytes -> Python value

    @property
    def is_complex(self) -> bool:
        return self.enumerator.startswith("Complex")

    @property
    def is_floating(self) -> bool:
        return self.name.startswith(("float", "bfloat"))


def scalar_type_name(index: int) -> str | None:
    """c10::ScalarType enumerator name for an index, or None if out of range."""
    return enumerators(lookup_type("c10::ScalarType")).get(index)


def dtype_from_index(index: int) -> DType:
    enumerator = scalar_type_name(index)
    if enumerator is None:
        raise Invalid(f"dtype #{index}")
    name, fmt = SCALAR_TYPES.get(enumerator, (enumerator.lower(), None))
    if fmt is None:
        return DType(enumerator, name, None, None)
    if fmt in _SPECIAL_DECODERS:
        size, decode = _SPECIAL_DECODERS[fmt]
        return DType(enumerator, name, size, decode)
    size = sum(_ITEM_SIZES[c] for c in fmt)
    if len(fmt) == 2:
        packed = struct.Struct("<" + fmt)
        return DType(enumerator, name, size, lambda raw: complex(*packed.unpack(raw)))
    single = struct.Struct("<" + fmt)
    return DType(enumerator, name, size, lambda raw: single.unpack(raw)[0])


def type_meta_dtype(type_meta: gdb.Value) -> DType | None:
    """The dtype of a caffe2::TypeMeta, or None when it is not a ScalarType."""
    index = int(member(type_meta, "index_"))
    if scalar_type_name(index) is None:
        return None
    return dtype_from_index(index)


_DEVICE_NAMES = {"PrivateUse1": "privateuseone"}


def device_name(device: gdb.Value) -> str:
    type_value = member(device, "type_")
    names = enumerators(type_value.type)
    raw_type = int(type_value)
    if raw_type not in names:
        raise Invalid(f"device type {raw_type}")
    name = _DEVICE_NAMES.get(names[raw_type], names[raw_type].lower())
    index = int(member(device, "index_"))
    return name if index < 0 else f"{name}:{index}"


# --- c10::SymInt -------------------------------------------------------------


@dataclass
class SymIntValue:
    value: int | None  # None when symbolic
    node: int = 0

    def __str__(self) -> str:
        return str(self.value) if self.value is not None else "<symbolic>"


def read_symint(symint: gdb.Value) -> SymIntValue:
    # c10::SymInt keeps a plain integer unless its top bits are 0b10 (then
    # the rest is a SymNodeImpl pointer): see c10/core/SymInt.h.
    data = int(member(symint, "data_"))
    bits = data & 0xFFFFFFFFFFFFFFFF
    if (bits >> 62) == 0b10:
        pointer = bits & ~(0b111 << 61) & 0xFFFFFFFFFFFFFFFF
        if pointer & (1 << 47):  # sign-extend a canonical address
            pointer |= 0xFFFF << 48
        return SymIntValue(None, pointer)
    return SymIntValue(data if data < (1 << 63) else data - (1 << 64))


def _small_vector_items(vector: gdb.Value, element_type: gdb.Type, limit: int) -> list[gdb.Value]:
    size = int(member(vector, "Size"))
    if size > limit:
        raise Invalid(f"{size} elements")
    begin = member(vector, "BeginX").cast(element_type.pointer())
    return [begin[i] for i in range(size)]


# --- c10::TensorImpl ---------------------------------------------------------


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
    info.sizes = [read_symint(v) for v in _small_vector_items(member(meta, "sizes_"), symint, MAX_DIMS)]
    info.strides = [read_symint(v) for v in _small_vector_items(member(meta, "strides_"), symint, MAX_DIMS)]
    info.storage_offset = read_symint(member(meta, "storage_offset_"))
    if len(info.sizes) != len(info.strides):
        raise Invalid(f"{len(info.sizes)} sizes but {len(info.strides)} strides")


# What the printers read of each class whose layout only a types object
# provides; `fuseops-load-types` checks that all of it is described.
LAYOUTS = {
    "c10::TensorImpl": (
        "data_type_", "device_opt_", "has_symbolic_sizes_strides_", "sizes_and_strides_",
        "storage_offset_", "numel_", "autograd_meta_", "storage_access_should_throw_",
        "storage_", "extra_meta_",
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


# --- formatting ----------------------------------------------------------------


def _plan(sizes: list[int], limit: int | None) -> list[list[int | None]]:
    """Per dimension, the indices shown (None marks the elided middle)."""
    total = math.prod(sizes)
    if limit is None or total <= limit:
        return [list(range(size)) for size in sizes]

    def shown(edge: int) -> int:
        return math.prod(min(size, 2 * edge) for size in sizes)

    edge = 1
    while shown(edge + 1) <= limit and edge < max(sizes):
        edge += 1
    counts = [min(size, 2 * edge) for size in sizes]
    # Too many dimensions for even one element from each end: show only the
    # first sub-tensor of the outer dimensions.
    for dim in range(len(sizes)):
        if math.prod(counts) <= limit:
            break
        counts[dim] = 1
    plan = []
    for size, count in zip(sizes, counts):
        if count >= size:
            plan.append(list(range(size)))
        elif count == 1:
            plan.append([0, None])
        else:
            half = count // 2
            plan.append(list(range(half)) + [None] + list(range(size - half, size)))
    return plan


def _float_formatter(values: list[float]):
    finite = [v for v in values if math.isfinite(v)]
    magnitudes = [abs(v) for v in finite if v != 0]
    integral = all(v == math.floor(v) for v in finite)
    scientific = bool(magnitudes) and (
        max(magnitudes) > 1e8 or (not integral and (max(magnitudes) / min(magnitudes) > 1000 or min(magnitudes) < 1e-4))
    )

    def fmt(v: float) -> str:
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if scientific:
            return f"{v:.4e}"
        if integral:
            return f"{v:.0f}."
        return f"{v:.4f}"

    return fmt


def _formatter(dtype: DType, values: list):
    if dtype.enumerator == "Bool":
        return lambda v: "True" if v else "False"
    if dtype.is_complex:
        real = _float_formatter([v.real for v in values])
        imag = _float_formatter([abs(v.imag) for v in values])

        def fmt_complex(v: complex) -> str:
            sign = "-" if v.imag < 0 or (v.imag == 0 and math.copysign(1, v.imag) < 0) else "+"
            return f"{real(v.real)}{sign}{imag(abs(v.imag))}j"

        return fmt_complex
    if isinstance(values[0], float):
        return _float_formatter(values)
    return str


def format_values(info: TensorInfo, limit: int | None) -> str:
    """The nested values, like torch's repr without "tensor(" and options.

    Raises gdb.MemoryError when the data cannot be read.
    """
    sizes = info.sizes
    if info.numel == 0:
        return "[]"
    dtype = info.dtype
    plan = _plan(sizes, limit)
    shown = list(itertools.product(*[[i for i in dim if i is not None] for dim in plan]))
    item = dtype.item_size
    offsets = {}
    for index in shown:
        element = info.storage_offset + sum(i * s for i, s in zip(index, info.strides))
        offsets[index] = element * item
    if offsets:
        low = min(offsets.values())
        high = max(offsets.values()) + item
        if low < 0 or (info.storage_bytes is not None and high > info.storage_bytes):
            raise Invalid(f"its view reaches outside its storage of {info.storage_bytes} bytes")
    if high - low <= _SPAN_READ_LIMIT:
        span = read_memory(info.data + low, high - low)
        raw = {index: span[off - low : off - low + item] for index, off in offsets.items()}
    else:
        raw = {index: read_memory(info.data + off, item) for index, off in offsets.items()}
    values = {index: dtype.decode(chunk) for index, chunk in raw.items()}
    fmt = _formatter(dtype, list(values.values()))
    text = {index: fmt(v) for index, v in values.items()}
    width = max(len(t) for t in text.values())
    ndim = len(sizes)

    def build(dim: int, prefix: tuple) -> str:
        if dim == ndim:
            return text[prefix].rjust(width)
        parts = ["..." if i is None else build(dim + 1, prefix + (i,)) for i in plan[dim]]
        if dim == ndim - 1:
            return "[" + ", ".join(parts) + "]"
        return "[" + ("," + "\n" * (ndim - dim - 1) + " " * (dim + 1)).join(parts) + "]"

    return build(0, ())


def format_shape(values: list) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def describe(info: TensorInfo) -> str:
    """One line: dtype, shape, device and what differs from the defaults."""
    words = [info.dtype.name, format_shape(info.sizes), info.device]
    contiguous = info.is_contiguous()
    if not contiguous:
        words.append("strides=" + format_shape(info.strides))
    if str(info.storage_offset) != "0":
        words.append(f"storage_offset={info.storage_offset}")
    if info.requires_grad is None:
        words.append("requires_grad=?")
    elif info.requires_grad:
        words.append("requires_grad=True")
    if info.grad is not None:
        grad = info.grad
        words.append("grad=<" + safe("grad", lambda: describe(read_tensor(grad))) + ">")
    return " ".join(words)


def format_tensor(kind: str, info: TensorInfo, limit: int | None, with_values: bool = True) -> str:
    if info.undefined:
        return f"{kind} undefined"
    head = f"{kind} {describe(info)}"
    if not with_values:
        return head
    if info.no_values is not None:
        return f"{head} <no values: {info.no_values}>"
    try:
        values = format_values(info, limit)
    except gdb.MemoryError as error:
        return f"{head} <no values: {_memory_error(error)}>"
    except Invalid as error:
        return f"{head} <no values: {error}>"
    if "\n" in values:
        return f"{head}\n{values}"
    return f"{head} = {values}"


def _memory_error(error: Exception) -> str:
    text = str(error)
    return text[0].lower() + text[1:] if text else "cannot read memory"


def safe(kind: str, action) -> str:
    """Runs action(); garbage and missing layouts become one short line."""
    try:
        return action()
    except Invalid as error:
        return f"<invalid {kind}: {error}>"
    except gdb.MemoryError as error:
        return f"<invalid {kind}: {_memory_error(error)}>"
    except LayoutError as error:
        return f"<{kind}: {error}>"
    except (gdb.error, OverflowError, ValueError, struct.error) as error:
        return f"<invalid {kind}: {error}>"
