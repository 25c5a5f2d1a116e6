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


def _registered_keys(operator: str) -> set[str]:
    dump = torch._C._dispatch_dump("fuseops::" + operator)
    return set(re.findall(r"^(\S+): registered", dump, re.M))


def test_each_operator_has_the_autograd_kernel_it_declares():
    # An operator `autograd:` names has an Autograd kernel; one of `ops:` it
    # leaves out has none (the out= overloads). `composite_ops:` it leaves
    # out register theirs by hand, if any (rope_cache_attention).
    read = GENERATOR.read_declaration
    declared = 0
    for path in DECLARATIONS:
        declaration = read(str(path))
        autograd = declaration.get("autograd", {})
        for schema in GENERATOR.all_schemas(declaration):
            operator = schema.split("(", 1)[0]
            has_kernel = "Autograd[alias]" in _registered_keys(operator)
            if operator in autograd:
                assert has_kernel, (path.stem, operator)
                declared += 1
            elif schema in declaration.get("ops", []):
                assert not has_kernel, (path.stem, operator)
    assert declared > 50


@pytest.mark.parametrize(
    "operator, make_args, message",
    [
        # A `no_derivative` operator, and one whose C++ function is named in
        # the declaration.
        (
            "swiglu_backward",
            lambda t: (t(), t(grad=True), t()),
            "fuseops::swiglu_backward is not differentiable",
        ),
        (
            "swiglu_backward.packed",
            lambda t: (t(), t(2, grad=True)),
            "fuseops::swiglu_backward.packed is not differentiable",
        ),
        # An `inference` operator.
        (
            "quantize_per_token_int8",
            lambda t: (t(grad=True),),
            "fuseops::quantize_per_token_int8 is an inference op with no derivative",
        ),
    ],
)
def test_a_declared_refusing_kernel_refuses_and_otherwise_runs(operator, make_args, message):
    def t(width=1, grad=False):
        return torch.randn(3, 4 * width, dtype=torch.float64).requires_grad_(grad)

    name, _, overload = operator.partition(".")
    op = getattr(getattr(torch.ops.fuseops, name), overload or "default")
    with pytest.raises(RuntimeError, match=re.escape(message)):
        op(*make_args(t))
    with torch.no_grad():
        result = op(*make_args(t))
    assert result is not None


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
        (
            "ops:\n - relu(Tensor input) -> Tensor\n",
            "expected `<key>:`, `  - <schema>` or `  <name>",
        ),
        ("# nothing\n", "declares no operator"),
        ("kernels:\n  forward ToyKernel\nops:\n  - a(Tensor x) -> Tensor\n", "<role>: <kernel"),
        ("kernels:\n  f: A\n  f: B\nops:\n  - a(Tensor x) -> Tensor\n", "'f' declared twice"),
        ("ops:\n  - a(Tensor x) -> Tensor\nautograd:\n  a: differentiable\n", "with a kind of"),
        ("ops:\n  - a(Tensor x) -> Tensor\nautograd:\n  a: function(f)\n", "with a kind of"),
        ("ops:\n  - a(Tensor x) -> Tensor\nautograd:\n  b: function\n", "b is not a declared"),
        (
            "ops:\n  - a(Tensor x) -> Tensor\nautograd:\n  a: function\n  a: inference\n",
            "'a' declared twice under 'autograd'",
        ),
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


def test_the_generated_autograd_registration_names_each_kernel(tmp_path):
    path = tmp_path / "toy.yaml"
    declaration = (
        "kernels:\n  forward: ToyKernel\n"
        "ops:\n  - toy(Tensor x) -> Tensor\n  - toy.packed(Tensor x) -> Tensor\n"
        "  - toy_backward(Tensor g, Tensor x) -> Tensor\n"
        "  - toy_backward.packed(Tensor g, Tensor x) -> Tensor\n"
        "composite_ops:\n  - pack_toy(Tensor w) -> Tensor\n"
        "autograd:\n  toy: function\n  toy.packed: function\n"
        "  toy_backward: no_derivative\n  toy_backward.packed: no_derivative(toy_packed_backward)\n"
        "  pack_toy: inference\n"
    )
    path.write_text(declaration)
    out = tmp_path / "out" / "ops_generated"
    assert GENERATOR.main(["generator", "toy", str(path), str(tmp_path / "out")]) == 0
    functions = (out / "autograd" / "toy.h").read_text()
    assert re.findall(r"m\.impl\(.*", functions) == [
        'm.impl("toy", TORCH_FN(Autograd::toy));',
        'm.impl("toy.packed", TORCH_FN(Autograd::toy_packed));',
    ]
    refusing = (out / "toy_autograd.cpp").read_text()
    assert re.findall(r"register_\w+<.*", refusing) == [
        'register_no_derivative<"fuseops::toy_backward", &::fuseops::toy_backward>(m);',
        'register_no_derivative<"fuseops::toy_backward.packed", '
        "&::fuseops::toy_packed_backward>(m);",
        'register_inference<"fuseops::pack_toy", &::fuseops::pack_toy>(m);',
    ]
    assert "#include <fuseops/toy.h>" in refusing
    # Each file goes with the last entry of its kind.
    path.write_text(declaration.split("autograd:")[0] + "autograd:\n  pack_toy: inference\n")
    assert GENERATOR.main(["generator", "toy", str(path), str(tmp_path / "out")]) == 0
    assert not (out / "autograd" / "toy.h").exists()
    assert "toy_backward" not in (out / "toy_autograd.cpp").read_text()
    path.write_text(declaration.split("autograd:")[0])
    assert GENERATOR.main(["generator", "toy", str(path), str(tmp_path / "out")]) == 0
    assert not (out / "toy_autograd.cpp").exists()
