"""Writes an op family's registration code from its declaration, cpp/ops/<op>.yaml.

fuseops_add_op(<op>) (cmake/FuseopsOps.cmake) runs it when CMake configures,
and again whenever the declaration or this script changes:

    python generate_op_registrations.py <op> <cpp/ops/<op>.yaml> <output folder>

The declaration lists the family's operators in the dispatcher's schema
language, under one of two keys:

    ops:            # kernels from <Op>Registrations (cpp/ops/<op>.h)
      - rms_norm(Tensor input, Tensor? weight=None, float? eps=None) -> Tensor
      - rms_norm.out(Tensor input, ..., *, Tensor(a!) out) -> ()
    composite_ops:  # registered by hand in cpp/ops/<op>.cpp
      - pack_int8_weight(Tensor weight) -> Tensor

It writes, into the output folder:

- ops_generated/<op>_schemas.cpp: every operator's definition (`m.def`), with
  the pt2_compliant tag, in the declaration's order;
- ops_generated/<op>.h (when the family has `ops:`): the function template
  `register_<op>_kernels<Registrations>(m)`, which registers each of `ops:`
  with the function of `Registrations` named as the operator with its
  overload joined by `_` (`rms_norm.out` -> `rms_norm_out`). The family's
  `register_all` calls it for Meta, CPU and CUDA.

The file is a small subset of YAML, read here without a YAML library: whole
line `#` comments, the two keys at the start of a line, and one `  - <schema>`
per line below them (tests_py/test_op_declarations.py checks that a YAML
reader reads the same). A file is rewritten only when its text changes, so an
unchanged declaration rebuilds nothing.
"""

from __future__ import annotations

import os
import re
import sys

KEYS = ("ops", "composite_ops")
# name[.overload](...) -> ...: what the dispatcher accepts as a schema's head.
SCHEMA = re.compile(r"([a-z_][a-z0-9_]*)(?:\.([a-z_][a-z0-9_]*))?\(.*\) -> .+")


class DeclarationError(Exception):
    pass


def read_declaration(path: str) -> dict[str, list[str]]:
    """The schemas under each key, in the file's order."""
    declaration: dict[str, list[str]] = {}
    key = None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            where = f"{path}:{number}"
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if line.endswith(":") and not line.startswith(" "):
                key = line[:-1]
                if key not in KEYS:
                    raise DeclarationError(f"{where}: unknown key {key!r} (expected one of {KEYS})")
                if key in declaration:
                    raise DeclarationError(f"{where}: {key!r} appears twice")
                declaration[key] = []
            elif line.startswith("  - ") and key is not None:
                schema = line[4:].strip()
                if not SCHEMA.fullmatch(schema):
                    raise DeclarationError(
                        f"{where}: {schema!r} is not a schema `name[.overload](...) -> ...`"
                    )
                if " #" in schema or ": " in schema:
                    raise DeclarationError(f"{where}: ' #' and ': ' would not read as YAML")
                declaration[key].append(schema)
            else:
                raise DeclarationError(f"{where}: expected `<key>:` or `  - <schema>`, got {line!r}")
    names = [operator_name(s) for schemas in declaration.values() for s in schemas]
    if not names:
        raise DeclarationError(f"{path}: declares no operator")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise DeclarationError(f"{path}: {', '.join(repeated)} declared more than once")
    return declaration


def operator_name(schema: str) -> str:
    """`rms_norm.out(...) -> ()` -> `rms_norm.out`."""
    return schema.split("(", 1)[0]


def function_name(schema: str) -> str:
    """The Registrations function of an operator: `rms_norm.out` -> `rms_norm_out`."""
    return operator_name(schema).replace(".", "_")


def cpp_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def schemas_source(op: str, declaration: dict[str, list[str]]) -> str:
    schemas = [s for key_schemas in declaration.values() for s in key_schemas]
    lines = [
        f"// Generated from cpp/ops/{op}.yaml by cmake/generate_op_registrations.py: edit those.",
        "",
        "#include <vector>",
        "",
        "#include <torch/library.h>",
        "",
        "TORCH_LIBRARY_FRAGMENT(fuseops, m) {",
        "  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};",
    ]
    lines += [f"  m.def({cpp_string(s)}, tags);" for s in schemas]
    lines += ["}", ""]
    return "\n".join(lines)


def kernels_header(op: str, declaration: dict[str, list[str]]) -> str:
    lines = [
        f"// Generated from cpp/ops/{op}.yaml by cmake/generate_op_registrations.py: edit those.",
        "#pragma once",
        "",
        "#include <torch/library.h>",
        "",
        "namespace fuseops::detail {",
        "",
        f"// Registers the kernels of {op}'s `ops:` for one backend: each is the",
        "// function of Registrations named as the operator, '.' written '_'.",
        "template <typename Registrations, typename Library>",
        f"void register_{op}_kernels(Library& m) {{",
    ]
    lines += [
        f"  m.impl({cpp_string(operator_name(s))}, TORCH_FN(Registrations::{function_name(s)}));"
        for s in declaration["ops"]
    ]
    lines += ["}", "", "}  // namespace fuseops::detail", ""]
    return "\n".join(lines)


def write_if_changed(path: str, text: str) -> None:
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    op, path, out = argv[1:]
    try:
        declaration = read_declaration(path)
    except (DeclarationError, OSError) as error:
        print(error, file=sys.stderr)
        return 1
    folder = os.path.join(out, "ops_generated")
    write_if_changed(os.path.join(folder, f"{op}_schemas.cpp"), schemas_source(op, declaration))
    if declaration.get("ops"):
        write_if_changed(os.path.join(folder, f"{op}.h"), kernels_header(op, declaration))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
