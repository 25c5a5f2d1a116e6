"""No import cycles between fuseops' modules: the op layer (fuseops.ops)
imports neither the modules built on it (nn, quantization, transformers) nor
the bench, and no two modules reach each other, lazily (an import inside a
function) or not. Read from the sources, so a lazy import counts as much as
one at the top of a file, and a package that discovers its modules
(fuseops.ops, with pkgutil) depends on each of them. Edges to the root package `fuseops` (the facade
that imports everything) and imports under `if TYPE_CHECKING:` (never
executed) are not dependencies."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "fuseops"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skipped


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = {module_name(p, root): p for p in root.rglob("*.py")}
    top = root.name
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text(), filename=str(path))
        skipped = type_checking_nodes(tree)
        deps = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")
                if node.level:
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                submodules = [
                    f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules
                ]
                targets = submodules or [target]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            deps.update(t for t in targets if t in modules and t not in (name, top))
        if path.name == "__init__.py" and "pkgutil.iter_modules" in path.read_text():
            deps.update(
                m
                for m in modules
                if m.rsplit(".", 1)[0] == name and not m.rsplit(".", 1)[1].startswith("_")
            )
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert "fuseops.ops.rms_norm" in graph and graph["fuseops.quantization"], "graph not read"
    assert cycles(graph) == []


def test_the_op_layer_imports_only_itself():
    """The op modules describe their bench rows with fuseops.ops._bench_case
    and import nothing built on them (nn, quantization, the bench)."""
    graph = import_graph(PACKAGE)
    outside = sorted(
        (name, dep)
        for name, deps in graph.items()
        if name.startswith("fuseops.ops")
        for dep in deps
        if not dep.startswith("fuseops.ops")
    )
    assert outside == [], outside
    assert "fuseops.ops.rms_norm" in graph["fuseops.ops"], "the discovered modules are edges"


def test_a_lazy_cycle_is_found(tmp_path):
    root = tmp_path / "pkg"
    (root / "ops").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "ops" / "__init__.py").write_text("")
    (root / "ops" / "op.py").write_text("def f():\n    from ..layer import g\n")
    (root / "layer.py").write_text("from .ops.op import f\n")
    (root / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .layer import f\n"
    )
    assert cycles(import_graph(root)) == [["pkg.layer", "pkg.ops.op"]]
    (root / "layer.py").write_text("")
    assert cycles(import_graph(root)) == []
    (root / "ops" / "__init__.py").write_text("import pkgutil\npkgutil.iter_modules(__path__)\n")
    (root / "ops" / "op.py").write_text("def f():\n    from .. import ops\n")
    assert cycles(import_graph(root)) == [["pkg.ops", "pkg.ops.op"]]


def test_import_fuseops_leaves_the_export_backends_alone():
    """The op modules declare their ONNX functions and ExecuTorch
    decompositions lazily: ``import fuseops`` (every op module with it)
    imports neither onnxscript, onnx nor executorch."""
    from support.processes import run_python

    backends = ("onnxscript", "onnx", "executorch")
    result = run_python(
        "import sys, fuseops, fuseops.ops\n"
        "assert len(fuseops.ops.MODULES) > 10\n"
        f"print(sorted(m for m in {backends!r} if m in sys.modules))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


def test_import_fuseops_leaves_the_op_cases_alone():
    """The calls that test and measure the ops (fuseops.ops.cases) are not
    on ``import fuseops``'s path; ``fuseops.ops.cases`` brings them all."""
    from support.processes import run_python

    result = run_python(
        "import sys, fuseops\n"
        "print(sorted(m for m in sys.modules if m.startswith('fuseops.ops.cases')))\n"
        "import fuseops.ops.cases\n"
        "print(len([m for m in sys.modules if m.startswith('fuseops.ops.cases.')]))\n"
    )
    assert result.returncode == 0, result.stderr
    before, after = result.stdout.split()
    assert before == "[]", result.stdout
    assert int(after) > 16, result.stdout


def test_every_op_module_has_a_cases_module_of_its_name():
    import fuseops.ops
    import fuseops.ops.cases as cases

    assert [cases.op_name(m) for m in cases.MODULES] == [
        cases.op_name(m) for m in fuseops.ops.MODULES
    ]
    for module in cases.MODULES:
        for declaration in ("samples", "fuzz", "bench_cases"):
            assert callable(getattr(module, declaration, None)), (module.__name__, declaration)
    assert cases.of(fuseops.ops.MODULES[0]) is cases.MODULES[0]
