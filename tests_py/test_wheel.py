"""A wheel to hand on: tools/build_wheel.sh builds and repairs it; its
metadata pins the torch it was compiled against; it installs with pip into a
fresh environment that gets only that torch, and runs there, from Python and
from a C++ program built against its CMake package."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

import fuseops

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_torch_pin():
    """The build's metadata provider (it lives outside the package)."""
    path = os.path.join(SOURCE_DIR, "tools", "packaging", "fuseops_torch_pin.py")
    spec = importlib.util.spec_from_file_location("fuseops_torch_pin", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fuseops_torch_pin = _load_torch_pin()


def test_wheel_pins_the_build_torch_and_source_keeps_the_range():
    assert fuseops_torch_pin.wheel_dependencies(["torch", "numpy>=1"], "2.13.0+cpu") == [
        "torch==2.13.0+cpu",
        "numpy>=1",
    ]
    assert fuseops_torch_pin.wheel_dependencies(["torch"], None) == ["torch"]
    pin = fuseops_torch_pin.TorchPin()
    settings = {"dependencies": ["torch"]}
    pin.build_state("sdist")
    assert pin.dynamic_metadata(settings, {}) == {"dependencies": ["torch"]}
    assert pin.dynamic_wheel(settings) == {"dependencies": True}
    for state in ("wheel", "metadata_wheel", "editable", "metadata_editable"):
        pin.build_state(state)
        assert pin.dynamic_metadata(settings, {}) == {
            "dependencies": [f"torch=={importlib.metadata.version('torch')}"]
        }, state


def test_build_torch_outside_the_source_range_fails_clearly():
    with pytest.raises(RuntimeError) as info:
        fuseops_torch_pin.wheel_dependencies(["torch>=2.14"], "2.13.0+cpu")
    assert "build environment has torch 2.13.0+cpu" in str(info.value)
    assert "'torch>=2.14'" in str(info.value)


def _run(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(a) for a in args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
    return result


def _plain_requirements(metadata: str) -> list[str]:
    """The Requires-Dist lines without an extra marker: what a plain install pulls in."""
    return [
        line.split(":", 1)[1].strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}


@pytest.mark.slow
def test_wheel_installs_and_runs_in_a_fresh_environment(tmp_path):
    dist = tmp_path / "dist"
    env = dict(os.environ)
    env.update(
        FUSEOPS_VENV=sys.prefix,
        # The developer build (tools/setup.sh's build dir and options), so the
        # wheel build is a no-op there instead of a full compile. Its wheel
        # holds what a plain build's does: the tests it adds are not installed.
        FUSEOPS_BUILD_DIR=os.environ.get("FUSEOPS_BUILD_DIR", "build/wheel"),
        FUSEOPS_PIP_ARGS=" ".join(
            ["-C cmake.define.FUSEOPS_BUILD_TESTS=ON", os.environ.get("FUSEOPS_PIP_ARGS", "")]
        ),
        FUSEOPS_DIST_DIR=str(dist),
    )
    _run("bash", os.path.join(SOURCE_DIR, "tools", "build_wheel.sh"), env=env, timeout=1200)

    [wheel] = os.listdir(dist)
    tag = re.fullmatch(
        rf"fuseops-{re.escape(fuseops.__version__)}-cp{sys.version_info.major}{sys.version_info.minor}"
        rf"-cp{sys.version_info.major}{sys.version_info.minor}-(\S+)\.whl",
        wheel,
    )
    assert tag, wheel
    assert re.fullmatch(rf"manylinux_2_\d+_{platform.machine()}(\.\S+)?", tag.group(1)), wheel
    build_torch = importlib.metadata.version("torch")
    with zipfile.ZipFile(dist / wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(f"fuseops-{fuseops.__version__}.dist-info/METADATA").decode()
    assert _plain_requirements(metadata) == [f"torch=={build_torch}"], metadata
    # Nothing grafted in (auditwheel puts copies in fuseops.libs/): torch's
    # libraries and its libgomp come from the torch package at run time.
    assert all(
        name.startswith(("fuseops/", f"fuseops-{fuseops.__version__}.dist-info/")) for name in names
    ), [n for n in names if not n.startswith("fuseops")]

    # A fresh venv, and pip resolves the pinned torch for it.
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    clean_env = _clean_env()
    _run(python, "-m", "pip", "install", "-q", dist / wheel, env=clean_env, timeout=900)
    _run(python, "-m", "pip", "check", env=clean_env)
    # Next to any other torch pip refuses the wheel, rather than leaving a
    # pair that fails at import.
    other = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--dry-run",
            str(dist / wheel),
            f"torch!={build_torch}",
        ],
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert other.returncode != 0, other.stdout
    assert (
        f"fuseops {fuseops.__version__} depends on torch=={build_torch}"
        in other.stdout + other.stderr
    ), other.stdout + other.stderr

    # In the fresh venv: the installed package (not the source tree, not the
    # build venv), torch's libraries through the wheel's RPATH, an op
    # against a float64 reference.
    code = (
        "import os, re, subprocess, sys, torch, fuseops, fuseops._C\n"
        "print('FILE', fuseops.__file__)\n"
        "print('TORCH', torch.__version__, fuseops.build_info()['torch_version'])\n"
        "print('PREFIX', fuseops.cmake_prefix_path)\n"
        "torch_lib = os.path.realpath(os.path.join(os.path.dirname(torch.__file__), 'lib'))\n"
        "for lib in (fuseops.library_path, fuseops._C.__file__):\n"
        "    ldd = subprocess.run(['ldd', lib], capture_output=True, text=True).stdout\n"
        "    assert 'not found' not in ldd, ldd\n"
        "    found = dict(re.findall(r'^\\s*(\\S+) => (\\S+)', ldd, flags=re.M))\n"
        "    for name in ('libc10.so', 'libtorch_cpu.so', 'libgomp.so.1'):\n"
        "        if name in found:\n"
        "            assert os.path.dirname(os.path.realpath(found[name])) == torch_lib, ldd\n"
        "    print('LIBS', os.path.basename(lib), sorted(found))\n"
        "torch.manual_seed(0)\n"
        "x = torch.randn(64, 257)\n"
        "w = torch.randn(257)\n"
        "y = fuseops.rms_norm(x, w, 1e-6)\n"
        "xd = x.double()\n"
        "ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()\n"
        # float32 against float64: the tolerance of tests_py/test_rms_norm.py
        # for float32 (a sum of 257 squares and an rsqrt, each a few ulps).
        "torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-6)\n"
        "print('RMS_NORM OK')\n"
    )
    result = _run(python, "-c", code, env=clean_env, timeout=300)
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    site = os.path.realpath(str(venv))
    assert os.path.realpath(lines["FILE"]).startswith(site + os.sep), result.stdout
    assert lines["TORCH"] == f"{build_torch} {build_torch}", result.stdout
    assert "RMS_NORM OK" in result.stdout
    assert "'libtorch_cpu.so'" in result.stdout and "'libgomp.so.1'" in result.stdout, result.stdout

    # A LibTorch program built against the installed CMake package: it finds
    # the torch beside fuseops in the fresh venv, and runs without
    # LD_LIBRARY_PATH.
    cmake = shutil.which("cmake", path=os.path.dirname(sys.executable)) or shutil.which("cmake")
    assert cmake, "cmake is not on PATH"
    build = tmp_path / "consumer"
    prefix = lines["PREFIX"]
    assert os.path.realpath(prefix).startswith(site + os.sep), prefix
    _run(
        cmake,
        "-S",
        os.path.join(SOURCE_DIR, "tests_cpp", "consumer"),
        "-B",
        build,
        "-G",
        "Ninja",
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_PREFIX_PATH={prefix}",
    )
    cache = (build / "CMakeCache.txt").read_text()
    torch_dir = re.search(r"^Torch_DIR:PATH=(.*)$", cache, flags=re.M).group(1)
    assert os.path.realpath(torch_dir).startswith(site + os.sep), torch_dir
    _run(cmake, "--build", build)
    ldd = _run("ldd", build / "fuseops_consumer", env=clean_env).stdout
    gomp = re.search(r"libgomp\.so\.1 => (\S+)", ldd)
    assert gomp and os.path.realpath(gomp.group(1)).startswith(site + os.sep), ldd
    program = _run(build / "fuseops_consumer", env=clean_env, timeout=120)
    assert f"(torch {build_torch})" in program.stdout, program.stdout
    assert "forward ok, backward ok" in program.stdout, program.stdout


@pytest.mark.slow
def test_sdist_keeps_the_source_range_and_wheel_metadata_pins(tmp_path):
    # The build backend as pip drives it, on this checkout's pyproject.toml.
    code = (
        "import sys, tarfile, scikit_build_core.build as backend\n"
        f"out = {str(tmp_path)!r}\n"
        "info = backend.prepare_metadata_for_build_wheel(out)\n"
        "print(open(f'{out}/{info}/METADATA').read())\n"
        "print('=== sdist')\n"
        "sdist = backend.build_sdist(out)\n"
        "with tarfile.open(f'{out}/{sdist}') as archive:\n"
        "    name = sdist[:-len('.tar.gz')]\n"
        "    print(archive.extractfile(f'{name}/PKG-INFO').read().decode())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=SOURCE_DIR, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    wheel, sdist = result.stdout.split("=== sdist")
    assert _plain_requirements(wheel) == [f"torch=={importlib.metadata.version('torch')}"], wheel
    assert _plain_requirements(sdist) == ["torch"], sdist
    assert "Dynamic: Requires-Dist" in sdist.splitlines(), sdist
