"""Each op family's operators are declared once, in cpp/ops/<op>.yaml.

cmake/generate_op_registrations.py writes their definitions and the kernel
registration of `<Op>Registrations` from it. These tests check that the files
are the YAML they look like (the generator reads a subset without a YAML
library), that the library defines exactly the declared operators, and that
the generator refuses a malformed declaration, naming the file and line.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest
import torch
import yaml

import fuseops  # noqa: F401  (loads the library)

SOURCE = pathlib.Path(__file__).resolve().parents[1]
DECLARATIONS = sorted((SOURCE / "cpp" / "ops").glob("*.yaml"))


def _load_generator():
    spec = importlib.util.spec_from_file_location(
        "generate_op_registrations", SOURCE / "cmake" / "generate_op_registrations.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATOR = _load_generator()


def families() -> list[str]:
    text = (SOURCE / "CMakeLists.txt").read_text()
    return re.findall(r"^fuseops_add_op\((\w+)", text, re.M)


def test_every_family_has_a_declaration():
    assert sorted(p.stem for p in DECLARATIONS) == sorted(families())


@pytest.mark.parametrize("path", DECLARATIONS, ids=lambda p: p.stem)
def test_the_generator_reads_what_yaml_reads(path):
    assert GENERATOR.read_declaration(str(path)) == yaml.safe_load(path.read_text())


def test_the_library_defines_exactly_the_declared_operators():
    read = GENERATOR.read_declaration
    declared = {
        "fuseops::" + schema.split("(", 1)[0]
        for path in DECLARATIONS
        for schema in GENERATOR.all_schemas(read(str(path)))
    }
    defined = {n for n in torch._C._dispatch_get_all_op_names() if n.startswith("fuseops::")}
    assert defined == declared
    # Every declared operator carries the tag the generator gives.
    for name in declared:
        op, _, overload = name.removeprefix("fuseops::").partition(".")
        packet = getattr(torch.ops.fuseops, op)
        assert torch.Tag.pt2_compliant_tag in getattr(packet, overload or "default").tags, name


def test_ops_are_registered_for_meta_and_cpu():
    # `ops:` take their kernels from <Op>Registrations on every backend; a
    # declared operator whose function is missing would fail to compile, one
    # left out of `ops:` would have no CPU kernel.
    read = GENERATOR.read_declaration
    for path in DECLARATIONS:
        declaration = read(str(path))
        assert bool(declaration.get("kernels")) == bool(declaration.get("ops")), path.stem
        for schema in declaration.get("ops", []):
            dump = torch._C._dispatch_dump("fuseops::" + schema.split("(", 1)[0])
            for key in ("CPU:", "Meta:"):
                assert key in dump, (path.stem, schema, dump)


@pytest.mark.parametrize(
    "text, message",
    [
        ("ops:\n  - relu(Tensor input) -> Tensor\nextra:\n", "unknown key 'extra'"),
        ("ops:\n  - relu(Tensor input)\n", "is not a schema"),
        ("ops:\n  - relu(Tensor input) -> Tensor # why\n", "would not read as YAML"),
        (
            "ops:\n  - relu(Tensor x) -> Tensor\n  - relu(Tensor y) -> Tensor\n",
            "relu declared more",
        ),
        ("ops:\n - relu(Tensor input) -> Tensor\n", "expected `<key>:` or `  - <schema>`"),
        ("# nothing\n", "declares no operator"),
        ("kernels:\n  forward ToyKernel\nops:\n  - a(Tensor x) -> Tensor\n", "<role>: <kernel"),
        ("kernels:\n  f: A\n  f: B\nops:\n  - a(Tensor x) -> Tensor\n", "'f' declared twice"),
        ("ops:\n  - a(Tensor x) -> Tensor\nops:\n  - b(Tensor x) -> Tensor\n", "appears twice"),
    ],
)
def test_a_malformed_declaration_is_refused_with_its_line(tmp_path, text, message):
    path = tmp_path / "toy.yaml"
    path.write_text(text)
    module = GENERATOR
    with pytest.raises(module.DeclarationError, match=re.escape(message)):
        module.read_declaration(str(path))


def test_the_generated_registration_names_each_function(tmp_path):
    path = tmp_path / "toy.yaml"
    path.write_text(
        "kernels:\n  forward: ToyKernel\n  backward: ToyBackwardKernel\n"
        "ops:\n  - toy(Tensor x) -> Tensor\n  - toy_backward.out(Tensor g, *, Tensor(a!) out) -> ()\n"
        "composite_ops:\n  - pack_toy(Tensor w) -> Tensor\n"
    )
    module = GENERATOR
    assert module.main(["generator", "toy", str(path), str(tmp_path / "out")]) == 0
    header = (tmp_path / "out" / "ops_generated" / "toy.h").read_text()
    assert 'm.impl("toy", TORCH_FN(Registrations::toy));' in header
    assert 'm.impl("toy_backward.out", TORCH_FN(Registrations::toy_backward_out));' in header
    assert "pack_toy" not in header
    schemas = (tmp_path / "out" / "ops_generated" / "toy_schemas.cpp").read_text()
    defs = re.findall(r'm\.def\("([^"]*)", tags\);', schemas)
    assert defs == [
        "toy(Tensor x) -> Tensor",
        "toy_backward.out(Tensor g, *, Tensor(a!) out) -> ()",
        "pack_toy(Tensor w) -> Tensor",
    ]
    # Each backend's Kernels: null for Meta, a table per role for the CPU.
    meta = (tmp_path / "out" / "ops_generated" / "toy_meta.cpp").read_text()
    assert "static ToyKernel forward() { return nullptr; }" in meta
    assert "ToyRegistrations<ToyMetaKernels>::register_all(m);" in meta
    cpu = (tmp_path / "out" / "ops_generated" / "cpu" / "toy.h").read_text()
    assert 'CpuKernelTable<detail::ToyBackwardKernel> backward{"toy backward"};' in cpu
    cuda = (tmp_path / "out" / "ops_generated" / "cuda" / "toy.h").read_text()
    assert 'detail::KernelSlot<detail::ToyKernel> forward{"toy forward"};' in cuda
    for backend in ("Cpu", "Cuda"):
        registration = (
            tmp_path / "out" / "ops_generated" / f"toy_{backend.lower()}.cpp"
        ).read_text()
        assert f"TORCH_LIBRARY_IMPL(fuseops, {backend.upper()}, m)" in registration
        assert (
            f"ToyRegistrations<::fuseops::{backend.lower()}::Toy{backend}Kernels>" in registration
        )
    # A declaration that loses its kernels loses their files.
    path.write_text("composite_ops:\n  - pack_toy(Tensor w) -> Tensor\n")
    assert module.main(["generator", "toy", str(path), str(tmp_path / "out")]) == 0
    assert not (tmp_path / "out" / "ops_generated" / "toy_meta.cpp").exists()
