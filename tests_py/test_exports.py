"""fuseops exports every op by an explicit import (written by
tools/generate_exports.py from the op modules' __all__), so a grep finds
where each public name comes from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import fuseops

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import generate_exports  # noqa: E402


def test_generated_exports_are_current():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "generate_exports.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_every_public_name_is_imported_by_name():
    """`grep "import" python/fuseops/__init__.py` names every op module's
    wrappers; fuseops.reference names every <op>_reference."""
    init = (ROOT / "python" / "fuseops" / "__init__.py").read_text()
    reference = (ROOT / "python" / "fuseops" / "reference.py").read_text()
    assert "globals().update" not in init + reference
    for module in fuseops.ops.MODULES:
        short = module.__name__.rsplit(".", 1)[1]
        for name in module.__all__:
            assert f"from .ops.{short} import" in init and f"    {name},\n" in init, name
            assert getattr(fuseops, name) is getattr(module, name)
        for name in dir(module):
            if name.endswith("_reference") and not name.startswith("_"):
                op = name[: -len("_reference")]
                assert f"    {name} as {op},\n" in reference, name
                assert getattr(fuseops.reference, op) is getattr(module, name)


def test_a_stale_block_is_reported(tmp_path):
    package = tmp_path / "fuseops"
    (package / "ops").mkdir(parents=True)
    (package / "ops" / "toy.py").write_text(
        '__all__ = ["toy"]\n\ndef toy():\n    pass\n\ndef toy_reference():\n    pass\n'
    )
    for name in ("__init__.py", "reference.py"):
        (package / name).write_text(f"{generate_exports.BEGIN}\n{generate_exports.END}\n")
    assert generate_exports.main(["--check", "--package", str(package)]) == 1
    assert generate_exports.main(["--package", str(package)]) == 0
    assert "from .ops.toy import (\n    toy,\n)" in (package / "__init__.py").read_text()
    assert "    toy_reference as toy,\n" in (package / "reference.py").read_text()
    assert generate_exports.main(["--check", "--package", str(package)]) == 0


def test_a_name_from_two_op_modules_is_an_error(tmp_path):
    ops = tmp_path / "ops"
    ops.mkdir()
    for module_name in ("first", "second"):
        (ops / f"{module_name}.py").write_text('__all__ = ["shared"]\n\ndef shared():\n    pass\n')
    with pytest.raises(SystemExit, match="'shared' is defined by two op modules: first and second"):
        generate_exports.collect(tmp_path)
