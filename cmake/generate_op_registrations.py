"""Writes an op family's registration code from its declaration, cpp/ops/<op>.yaml.

fuseops_add_op(<op>) (cmake/FuseopsOps.cmake) runs it when CMake configures,
and again whenever the declaration or this script changes:

    python generate_op_registrations.py <op> <cpp/ops/<op>.yaml> <output folder>

The declaration lists the family's kernels, by role and type (a function
pointer type of cpp/ops/<op>.h), and its operators in the dispatcher's schema
language:

    kernels:        # what <Op>Registrations<Kernels> asks of a backend
      forward: RmsNormForwardKernel
      backward: RmsNormBackwardKernel
    ops:            # kernels from <Op>Registrations (cpp/ops/<op>.h)
      - rms_norm(Tensor input, Tensor? weight=None, float? eps=None) -> Tensor
      - rms_norm.out(Tensor input, ..., *, Tensor(a!) out) -> ()
    composite_ops:  # registered by hand in cpp/ops/<op>.cpp
      - pack_int8_weight(Tensor weight) -> Tensor
    autograd:       # each operator's Autograd kernel
      rms_norm: function
      rms_norm_backward: no_derivative
      swiglu_backward.packed: no_derivative(swiglu_packed_backward)

It writes, into the output folder:

- ops_generated/<op>_schemas.cpp: every operator's definition (`m.def`), with
  the pt2_compliant tag, in the declaration's order;
- ops_generated/<op>.h (with `ops:`): the function template
  `register_<op>_kernels<Registrations>(m)`, which registers each of `ops:`
  with the function of `Registrations` named as the operator with its
  overload joined by `_` (`rms_norm.out` -> `rms_norm_out`). The family's
  `register_all` calls it for Meta, CPU and CUDA;
- with `kernels:`, each backend's `Kernels` and its registration:
  ops_generated/<op>_meta.cpp (every kernel nullptr: Meta kernels only
  allocate), ops_generated/cpu/<op>.h (`<Op>CpuKernels`, one CpuKernelTable
  per role, which cpp/ops/cpu/<op>_kernel.cpp fills once per CPU capability)
  and ops_generated/<op>_cpu.cpp, which registers it for the CPU key;
  ops_generated/cuda/<op>.h (`<Op>CudaKernels`, one KernelSlot per role,
  which cuda/<op>_kernel.cu fills) and ops_generated/<op>_cuda.cpp, which
  registers it for the CUDA key (compiled in CUDA builds only);
- with `autograd:`, each operator's Autograd kernel. A `function` is the
  static member of `<Op>Autograd` (cpp/ops/autograd/<op>.cpp) named as the
  operator, '.' written '_': ops_generated/autograd/<op>.h has the function
  template `register_<op>_autograd<Autograd>(m)`, which that file calls. A
  `no_derivative` or `inference` operator has the one kernel of
  cpp/ops/autograd/no_derivative.h: it refuses a call that would record a
  gradient, then runs the public C++ function `fuseops::<operator>` (or the
  one named in parentheses); ops_generated/<op>_autograd.cpp registers them.

The file is a small subset of YAML, read here without a YAML library: whole
line `#` comments, the keys at the start of a line, one `  - <schema>`, `  <role>: <type>` or
`  <operator>: <kind>` per line below them (tests_py/test_op_declarations.py
checks that a YAML reader reads the same). A file is rewritten only when its
text changes, so an unchanged declaration rebuilds nothing.
"""

from __future__ import annotations

import os
import re
import sys

KEYS = ("kernels", "ops", "composite_ops", "autograd")
# The keys whose lines are `  <name>: <value>` rather than `  - <schema>`.
MAPS = ("kernels", "autograd")
GENERATED = "// Generated from cpp/ops/{op}.yaml by cmake/generate_op_registrations.py: edit those."
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# name[.overload](...) -> ...: what the dispatcher accepts as a schema's head.
OPERATOR = r"[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)?"
SCHEMA = re.compile(OPERATOR + r"\(.*\) -> .+")
# An Autograd kernel: `function`, or a refusing kind with the C++ function it
# runs when that is not named as the operator.
AUTOGRAD_KINDS = ("function", "no_derivative", "inference")
AUTOGRAD = re.compile(r"(function)|(no_derivative|inference)(?:\(([a-z_][a-z0-9_]*)\))?")


class DeclarationError(Exception):
    pass


def read_declaration(path: str) -> dict:
    """The kernels' types by role, and the schemas under each key, in the file's order."""
    declaration: dict = {}
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
                declaration[key] = {} if key in MAPS else []
            elif key in MAPS and line.startswith("  ") and not line.startswith("   "):
                name, _, value = line.strip().partition(": ")
                if key == "kernels" and not (
                    IDENTIFIER.fullmatch(name) and IDENTIFIER.fullmatch(value)
                ):
                    raise DeclarationError(f"{where}: expected `  <role>: <kernel type>`, got {line!r}")
                if key == "autograd" and not (
                    re.fullmatch(OPERATOR, name) and AUTOGRAD.fullmatch(value)
                ):
                    raise DeclarationError(
                        f"{where}: expected `  <operator>: <kind>` with a kind of "
                        f"{AUTOGRAD_KINDS} (a refusing kind may name its C++ function: "
                        f"`no_derivative(<function>)`), got {line!r}"
                    )
                if name in declaration[key]:
                    raise DeclarationError(f"{where}: {name!r} declared twice under {key!r}")
                declaration[key][name] = value
            elif line.startswith("  - ") and key not in (None, *MAPS):
                schema = line[4:].strip()
                if not SCHEMA.fullmatch(schema):
                    raise DeclarationError(
                        f"{where}: {schema!r} is not a schema `name[.overload](...) -> ...`"
                    )
                if " #" in schema or ": " in schema:
                    raise DeclarationError(f"{where}: ' #' and ': ' would not read as YAML")
                declaration[key].append(schema)
            else:
                raise DeclarationError(
                    f"{where}: expected `<key>:`, `  - <schema>` or `  <name>: <value>`, got {line!r}"
                )
    names = [operator_name(s) for s in all_schemas(declaration)]
    if not names:
        raise DeclarationError(f"{path}: declares no operator")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise DeclarationError(f"{path}: {', '.join(repeated)} declared more than once")
    undeclared = [n for n in declaration.get("autograd", {}) if n not in names]
    if undeclared:
        raise DeclarationError(f"{path}: autograd: {', '.join(undeclared)} is not a declared operator")
    return declaration


def all_schemas(declaration: dict) -> list[str]:
    """Every operator's schema: `ops:` first, then `composite_ops:`."""
    return [s for key in ("ops", "composite_ops") for s in declaration.get(key, [])]


def camel_case(op: str) -> str:
    """As the family's C++ types spell it: sparse_2_4 -> Sparse24."""
    return "".join(part[:1].upper() + part[1:] for part in op.split("_"))


def operator_name(schema: str) -> str:
    """`rms_norm.out(...) -> ()` -> `rms_norm.out`."""
    return schema.split("(", 1)[0]


def function_name(schema: str) -> str:
    """The C++ function of an operator (given by its schema or its name):
    `rms_norm.out` -> `rms_norm_out`."""
    return operator_name(schema).replace(".", "_")


def cpp_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def schemas_source(op: str, declaration: dict) -> str:
    lines = [
        GENERATED.format(op=op),
        "",
        "#include <vector>",
        "",
        "#include <torch/library.h>",
        "",
        "TORCH_LIBRARY_FRAGMENT(fuseops, m) {",
        "  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};",
    ]
    lines += [f"  m.def({cpp_string(s)}, tags);" for s in all_schemas(declaration)]
    lines += ["}", ""]
    return "\n".join(lines)


def register_template_header(
    op: str, what: str, template: str, entries: list[tuple[str, str]], registers: str
) -> str:
    """The function template `register_<op>_<what><Template>(m)`, which
    registers each (operator, function) pair with `Template::function`."""
    lines = [
        GENERATED.format(op=op),
        "#pragma once",
        "",
        "#include <torch/library.h>",
        "",
        "namespace fuseops::detail {",
        "",
        f"// Registers {registers}: each is the",
        f"// function of {template} named as the operator, '.' written '_'.",
        f"template <typename {template}, typename Library>",
        f"void register_{op}_{what}(Library& m) {{",
    ]
    lines += [
        f"  m.impl({cpp_string(name)}, TORCH_FN({template}::{function}));"
        for name, function in entries
    ]
    lines += ["}", "", "}  // namespace fuseops::detail", ""]
    return "\n".join(lines)


def meta_source(op: str, kernels: dict[str, str]) -> str:
    name = camel_case(op)
    lines = [
        GENERATED.format(op=op),
        "// Meta kernels allocate the outputs and compute nothing: every kernel is null.",
        "",
        "#include <torch/library.h>",
        "",
        f'#include "ops/{op}.h"',
        "",
        "namespace fuseops::detail {",
        "namespace {",
        "",
        f"struct {name}MetaKernels {{",
    ]
    lines += [f"  static {t} {role}() {{ return nullptr; }}" for role, t in kernels.items()]
    lines += [
        "};",
        "",
        "}  // namespace",
        "",
        "TORCH_LIBRARY_IMPL(fuseops, Meta, m) {",
        f"  {name}Registrations<{name}MetaKernels>::register_all(m);",
        "}",
        "",
        "}  // namespace fuseops::detail",
        "",
    ]
    return "\n".join(lines)


def kernels_header(op: str, backend: str, kernels: dict[str, str]) -> str:
    """`<Op><Backend>Kernels`: one `holder<kernel type>` per role, which the
    backend's kernel file fills and the family's Registrations call."""
    name = camel_case(op)
    include, holder, filled_by = {
        "Cpu": (
            "ops/cpu/dispatch.h",
            "CpuKernelTable",
            f"cpp/ops/cpu/{op}_kernel.cpp fills them once per CPU capability",
        ),
        "Cuda": ("ops/common/kernel_slot.h", "detail::KernelSlot", f"cuda/{op}_kernel.cu fills them"),
    }[backend]
    lines = [
        GENERATED.format(op=op),
        f"// The {backend.upper()} kernels of {op}: {filled_by}.",
        "#pragma once",
        "",
        f'#include "{include}"',
        f'#include "ops/{op}.h"',
        "",
        f"namespace fuseops::{backend.lower()} {{",
        "",
        f"struct {name}{backend}Kernels {{",
    ]
    lines += [
        f"  static inline constinit {holder}<detail::{kernel_type}> {role}"
        f"{{{cpp_string(op + ' ' + role)}}};"
        for role, kernel_type in kernels.items()
    ]
    lines += ["};", "", f"}}  // namespace fuseops::{backend.lower()}", ""]
    return "\n".join(lines)


def backend_registration(op: str, backend: str) -> str:
    """Registers `<Op>Registrations<<Op><Backend>Kernels>` for the backend's key."""
    name = camel_case(op)
    kernels = f"::fuseops::{backend.lower()}::{name}{backend}Kernels"
    lines = [
        GENERATED.format(op=op),
        "",
        "#include <torch/library.h>",
        "",
        f'#include "ops_generated/{backend.lower()}/{op}.h"',
        "",
        f"TORCH_LIBRARY_IMPL(fuseops, {backend.upper()}, m) {{",
        f"  ::fuseops::detail::{name}Registrations<{kernels}>::register_all(m);",
        "}",
        "",
    ]
    return "\n".join(lines)


def autograd_kernels(declaration: dict, kinds: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(operator, kind, C++ function) of each `autograd:` entry of these kinds."""
    entries = []
    for name, value in declaration.get("autograd", {}).items():
        match = AUTOGRAD.fullmatch(value)
        kind = match.group(1) or match.group(2)
        if kind in kinds:
            entries.append((name, kind, match.group(3) or function_name(name)))
    return entries


def refusing_autograd_source(op: str, refusing: list[tuple[str, str, str]]) -> str:
    """The Autograd kernels of the operators without a derivative."""
    lines = [
        GENERATED.format(op=op),
        "// Operators without a derivative: their Autograd kernel refuses a call that",
        "// would record a gradient, then runs the op below autograd",
        "// (cpp/ops/autograd/no_derivative.h).",
        "",
        "#include <torch/library.h>",
        "",
        f"#include <fuseops/{op}.h>",
        "",
        '#include "ops/autograd/no_derivative.h"',
        "",
        "TORCH_LIBRARY_IMPL(fuseops, Autograd, m) {",
    ]
    lines += [
        f"  ::fuseops::autograd_detail::register_{kind}<{cpp_string('fuseops::' + name)}, "
        f"&::fuseops::{function}>(m);"
        for name, kind, function in refusing
    ]
    lines += ["}", ""]
    return "\n".join(lines)


def write_or_remove(path: str, text: str | None) -> None:
    """Writes the file, or removes one left from an earlier declaration."""
    if text is not None:
        write_if_changed(path, text)
    elif os.path.exists(path):
        os.remove(path)


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
        entries = [(operator_name(s), function_name(s)) for s in declaration["ops"]]
        write_if_changed(
            os.path.join(folder, f"{op}.h"),
            register_template_header(
                op, "kernels", "Registrations", entries, f"the kernels of {op}'s `ops:` for one backend"
            ),
        )
    kernels = declaration.get("kernels")
    backends = {
        os.path.join(folder, f"{op}_meta.cpp"): lambda: meta_source(op, kernels),
        os.path.join(folder, "cpu", f"{op}.h"): lambda: kernels_header(op, "Cpu", kernels),
        os.path.join(folder, f"{op}_cpu.cpp"): lambda: backend_registration(op, "Cpu"),
        os.path.join(folder, "cuda", f"{op}.h"): lambda: kernels_header(op, "Cuda", kernels),
        os.path.join(folder, f"{op}_cuda.cpp"): lambda: backend_registration(op, "Cuda"),
    }
    for path, source in backends.items():
        write_or_remove(path, source() if kernels else None)
    functions = autograd_kernels(declaration, ("function",))
    refusing = autograd_kernels(declaration, ("no_derivative", "inference"))
    write_or_remove(
        os.path.join(folder, "autograd", f"{op}.h"),
        register_template_header(
            op,
            "autograd",
            "Autograd",
            [(n, f) for n, _, f in functions],
            f"the Autograd kernels of {op} that are functions",
        )
        if functions
        else None,
    )
    write_or_remove(
        os.path.join(folder, f"{op}_autograd.cpp"),
        refusing_autograd_source(op, refusing) if refusing else None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
