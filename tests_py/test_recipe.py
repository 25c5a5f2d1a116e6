"""The "Adding an op" recipe (CONTRIBUTING.md) is complete.

A scratch copy of the source tree gains an op family ``toy`` made the way the
recipe says: relu's files (the smallest complete family, which the recipe
says to copy) under the new name, plus one line in CMakeLists.txt. It must
configure and build with nothing else edited, and the new op must come out
registered for the CPU, Meta and Autograd keys, with its kernels compiled in
every CPU build. The file list is read from ``fuseops_add_op``'s own
documentation in cmake/FuseopsOps.cmake (what it checks exists), so a recipe
that gains a file is tested with it.

To stay short, the scratch build has only relu and toy, no gtests and no
Python module; the new op is loaded into a fresh interpreter with
``torch.ops.load_library``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from support.cpu_builds import cpu_runs
from support.processes import run_python

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the library's CMake reads; tests_cpp and the Python package are not built.
COPIED = ("CMakeLists.txt", "pyproject.toml", "cmake", "cpp", "cuda", "python/csrc", "tools/gdb")


def recipe_files(name: str) -> list[str]:
    """The files fuseops_add_op(<name>) requires, from its documentation."""
    with open(os.path.join(SOURCE_DIR, "cmake", "FuseopsOps.cmake")) as f:
        text = f.read()
    paths = re.findall(r"^#   ((?:cpp|cuda|python|tests_cpp)/\S*<name>\S*)", text, re.M)
    assert len(paths) >= 6, f"cmake/FuseopsOps.cmake no longer lists a family's files: {paths}"
    return [p.replace("<name>", name) for p in paths]


def rename(text: str) -> str:
    return text.replace("relu", "toy").replace("Relu", "Toy").replace("RELU", "TOY")


def make_scratch_tree(root: str) -> None:
    for path in COPIED:
        source = os.path.join(SOURCE_DIR, path)
        if os.path.isdir(source):
            shutil.copytree(
                source, os.path.join(root, path), ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy(source, os.path.join(root, path))
    for relu_path, toy_path in zip(recipe_files("relu"), recipe_files("toy")):
        with open(os.path.join(SOURCE_DIR, relu_path)) as f:
            text = f.read()
        for path, content in ((relu_path, text), (toy_path, rename(text))):
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(content)
    cmakelists = os.path.join(root, "CMakeLists.txt")
    with open(cmakelists) as f:
        text = f.read()
    families = re.findall(r"^fuseops_add_op\(.*\)\n", text, re.M)
    assert "fuseops_add_op(relu)\n" in families
    for line in families:
        text = text.replace(
            line, "" if line != "fuseops_add_op(relu)\n" else line + "fuseops_add_op(toy)\n"
        )
    with open(cmakelists, "w") as f:
        f.write(text)


@pytest.mark.slow
def test_an_op_made_by_the_recipe_builds_and_registers(tmp_path):
    root = str(tmp_path / "src")
    os.makedirs(root)
    make_scratch_tree(root)
    build = str(tmp_path / "build")
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, CCACHE_BASEDIR=str(tmp_path))
    configure = subprocess.run(
        [
            shutil.which("cmake", path=bin_dir),
            "-S",
            root,
            "-B",
            build,
            "-G",
            "Ninja",
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DFUSEOPS_BUILD_TESTS=OFF",
            "-DFUSEOPS_BUILD_PYTHON=OFF",
            "-DFUSEOPS_CUDA=OFF",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert configure.returncode == 0, configure.stdout + configure.stderr
    built = subprocess.run(
        [shutil.which("cmake", path=bin_dir), "--build", build, "--target", "fuseops"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert built.returncode == 0, built.stdout[-5000:] + built.stderr[-5000:]
    library = [f for f in os.listdir(build) if f.startswith("libfuseops") and ".so" in f]
    assert library, os.listdir(build)

    # relu's semantics, which toy copied: exact, NaN passes, and the
    # gradient flows where the result is > 0 or NaN.
    x = torch.tensor([float("nan"), -2.0, -0.0, 0.5, 3.0, float("-inf"), float("inf")] * 11)
    torch.save(x, tmp_path / "x.pt")
    code = (
        "import torch\n"
        f"torch.ops.load_library({os.path.join(build, library[0])!r})\n"
        f"x = torch.load({str(tmp_path / 'x.pt')!r}).requires_grad_()\n"
        "y = torch.ops.fuseops.toy(x)\n"
        "y.sum().backward()\n"
        "meta = torch.ops.fuseops.toy(torch.empty(5, 3, device='meta'))\n"
        "keys = torch._C._dispatch_dump('fuseops::toy')\n"
        "torch.save({'y': y.detach(), 'grad': x.grad, 'meta': tuple(meta.shape),\n"
        "            'keys': keys}, " + repr(str(tmp_path / "out.pt")) + ")\n"
    )
    passes = (x > 0) | x.isnan()
    runnable = [c for c in ("default", "avx2", "avx512") if cpu_runs(c)]
    for capability in runnable:
        result = run_python(code, {"ATEN_CPU_CAPABILITY": capability})
        assert result.returncode == 0, result.stderr
        out = torch.load(tmp_path / "out.pt")
        torch.testing.assert_close(
            out["y"], torch.where(passes, x, 0), rtol=0, atol=0, equal_nan=True
        )
        torch.testing.assert_close(out["grad"], passes.to(x.dtype), rtol=0, atol=0)
        assert out["meta"] == (5, 3)
        for key in ("CPU:", "Meta:", "Autograd"):
            assert key in out["keys"], out["keys"]
    # Each CPU build compiled the toy kernels (the per-capability object
    # libraries hold one object per kernel file).
    objects = subprocess.run(
        ["find", build, "-name", "toy_kernel.cpp.o"], capture_output=True, text=True
    )
    capabilities = sorted(re.findall(r"fuseops_cpu_(\w+)\.dir", objects.stdout))
    assert capabilities == sorted(["AVX2", "AVX512", "DEFAULT"]), objects.stdout
