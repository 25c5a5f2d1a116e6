"""Reading torch and libstdc++ objects by field name from debug information.

Nothing here knows an offset: every access goes through the field names
that the debug information of the inspected program describes, so a torch
upgrade that keeps the names keeps working, and one that renames a field
fails with a LayoutError naming it.
"""

from __future__ import annotations

import os

import gdb


class LayoutError(Exception):
    """The debug information does not describe what the printers expect."""


class Invalid(Exception):
    """The object holds values no live object of its type can hold."""


# The README installed beside the printers (tools/gdb/README.md in a checkout,
# <site-packages>/fuseops/share/gdb/README.md in a wheel).
README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")

# Debug information that only declares these classes is the usual reason
# for a missing field; say how to get the full description.
TYPES_HINT = (
    "the program's debug information only declares it; run `fuseops-load-types` "
    f'(see {README}, "Type information")'
)


def _describe(type_: gdb.Type) -> str:
    return str(type_.strip_typedefs().unqualified())


def is_incomplete(type_: gdb.Type) -> bool:
    type_ = type_.strip_typedefs()
    if type_.code not in (gdb.TYPE_CODE_STRUCT, gdb.TYPE_CODE_UNION):
        return False
    try:
        return not type_.fields() and type_.sizeof <= 1
    except (gdb.error, TypeError):
        return True


def member(value: gdb.Value, name: str) -> gdb.Value:
    """value.name, searching base classes; LayoutError when there is none."""
    try:
        return value[name]
    except gdb.error as error:
        if (
            "no member named" not in str(error).lower()
            and "there is no member" not in str(error).lower()
        ):
            raise
        if is_incomplete(value.type):
            raise LayoutError(f"{_describe(value.type)} has no layout: {TYPES_HINT}") from None
        raise LayoutError(
            f"{_describe(value.type)} has no field '{name}' (renamed in this torch "
            f"version?); the fuseops printers need updating"
        ) from None


def lookup_type(name: str) -> gdb.Type:
    try:
        type_ = gdb.lookup_type(name)
    except gdb.error:
        raise LayoutError(f"no debug information for {name}: {TYPES_HINT}") from None
    return type_


def missing_layout(name: str, fields: tuple[str, ...]) -> str | None:
    """What the debug information lacks of class `name` and its `fields`, or None."""
    try:
        type_ = gdb.lookup_type(name).strip_typedefs()
    except gdb.error:
        return f"{name}: not described"
    if is_incomplete(type_):
        return f"{name}: only declared"
    present = set()
    pending = [type_]
    while pending:
        for field in pending.pop().fields():
            if field.is_base_class:
                pending.append(field.type.strip_typedefs())
            elif field.name:
                present.add(field.name)
    absent = [field for field in fields if field not in present]
    if absent:
        return f"{name}: no field " + ", ".join(absent)
    return None


def deref(pointer: gdb.Value, type_: gdb.Type | None = None) -> gdb.Value:
    """*pointer as its declared type, or as type_ when given.

    gdb's own dereference (and a cast between class pointers) looks up the
    dynamic type of a polymorphic object, and warns ("RTTI symbol not found
    for class ...") whenever the debug information lacks that subclass --
    torch's DifferentiableViewMeta, any TensorImpl subclass. Through a
    pointer to an array of the type it does not look.
    """
    target = (type_ or pointer.type.strip_typedefs().target()).strip_typedefs()
    if is_incomplete(target):
        # Nothing to look up, and no array of it; member() names what is missing.
        return pointer.cast(target.pointer()).dereference()
    return pointer.cast(target.array(0).pointer()).dereference()[0]


def type_name(value: gdb.Value) -> str:
    type_ = value.type
    if type_.code == gdb.TYPE_CODE_REF or type_.code == gdb.TYPE_CODE_RVALUE_REF:
        type_ = type_.target()
    return str(type_.strip_typedefs().unqualified())


def address_of(pointer: gdb.Value) -> int:
    return int(pointer.cast(lookup_type("unsigned long")))


def _find_head_impl(value: gdb.Value, depth: int = 0) -> gdb.Value | None:
    # libstdc++'s unique_ptr keeps its pointer in a std::tuple whose elements
    # are all called _M_head_impl (the deleter's too): take the first pointer.
    if depth > 8:
        return None
    type_ = value.type.strip_typedefs()
    if type_.code != gdb.TYPE_CODE_STRUCT:
        return None
    for field in type_.fields():
        if field.is_base_class:
            found = _find_head_impl(value.cast(field.type), depth + 1)
        elif field.name == "_M_head_impl" and field.type.strip_typedefs().code == gdb.TYPE_CODE_PTR:
            return value[field]
        elif field.name is not None and field.type.strip_typedefs().code == gdb.TYPE_CODE_STRUCT:
            found = _find_head_impl(value[field], depth + 1)
        else:
            continue
        if found is not None:
            return found
    return None


def pointer_of(value: gdb.Value) -> gdb.Value:
    """The raw pointer held by a raw, c10::intrusive_ptr, std::unique_ptr or std::shared_ptr."""
    type_ = value.type.strip_typedefs()
    if type_.code == gdb.TYPE_CODE_PTR:
        return value
    name = str(type_.unqualified())
    if name.startswith(("c10::intrusive_ptr<", "c10::weak_intrusive_ptr<")):
        return member(value, "target_")
    if name.startswith(("std::shared_ptr<", "std::__shared_ptr<")):
        return member(value, "_M_ptr")
    if name.startswith("std::unique_ptr<"):
        found = _find_head_impl(value)
        if found is None:
            raise LayoutError(f"cannot find the pointer inside {name} (not libstdc++?)")
        return found
    raise LayoutError(f"{name} is not a pointer type the fuseops printers know")


def optional_of(value: gdb.Value) -> gdb.Value | None:
    """The contained value of a libstdc++ std::optional, or None."""
    payload = member(value, "_M_payload")
    if not bool(member(payload, "_M_engaged")):
        return None
    return member(member(payload, "_M_payload"), "_M_value")


_enum_cache: dict[str, dict[int, str]] = {}


def enumerators(type_: gdb.Type) -> dict[int, str]:
    """Value -> short enumerator name, from the debug information."""
    type_ = type_.strip_typedefs()
    key = str(type_)
    cached = _enum_cache.get(key)
    if cached is None:
        if type_.code != gdb.TYPE_CODE_ENUM:
            raise LayoutError(f"{key} is not an enum in the debug information")
        cached = {int(field.enumval): field.name.rsplit("::", 1)[-1] for field in type_.fields()}
        _enum_cache[key] = cached
    return cached


def clear_caches(*_args) -> None:
    _enum_cache.clear()


def read_memory(address: int, length: int) -> bytes:
    return bytes(gdb.selected_inferior().read_memory(address, length))
