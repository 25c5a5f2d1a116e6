"""Decoding what memory holds into Python values: dtypes and their element
decoders, device names, c10::SymInt."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import gdb

from ._layout import Invalid, enumerators, lookup_type, member

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

_ITEM_SIZES = {
    "B": 1,
    "b": 1,
    "h": 2,
    "H": 2,
    "i": 4,
    "I": 4,
    "q": 8,
    "Q": 8,
    "e": 2,
    "f": 4,
    "d": 8,
    "?": 1,
}


def _minifloat(bits: int, exponent_bits: int, mantissa_bits: int, bias: int, kind: str) -> float:
    sign = -1.0 if bits >> (exponent_bits + mantissa_bits) else 1.0
    exponent = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1)
    mantissa = bits & ((1 << mantissa_bits) - 1)
    if kind == "fnuz" and bits == 0x80:
        return math.nan
    if kind == "ieee" and exponent == (1 << exponent_bits) - 1:
        return sign * math.inf if mantissa == 0 else math.nan
    if (
        kind == "fn"
        and exponent == (1 << exponent_bits) - 1
        and mantissa == (1 << mantissa_bits) - 1
    ):
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
