"""The README's code blocks, run as written so that they cannot rot: every
```python block, and the ```cmake and ```cpp blocks of "Using fuseops from
C++" as one project built against the installed package and run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import fuseops

from conftest import run_python

README = Path(__file__).resolve().parents[1] / "README.md"
TESTED_LANGUAGES = ("python", "cmake", "cpp")


def fenced_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block in the README."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", README.read_text(), flags=re.S | re.M)


def blocks(language: str) -> list[str]:
    return [code for lang, code in fenced_blocks() if lang == language]


def test_every_fenced_block_is_tested():
    languages = [lang for lang, _ in fenced_blocks()]
    assert languages, "no fenced code blocks found in README.md"
    assert set(languages) <= set(TESTED_LANGUAGES), languages
    assert len(blocks("cmake")) == len(blocks("cpp")) == 1, "one C++ project: one cmake and one cpp block"


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_block_runs(index):
    result = run_python(blocks("python")[index])
    assert result.returncode == 0, result.stderr


def cpp_program(snippet: str) -> str:
    """The snippet as a program: its #include lines, then the rest as main's body."""
    lines = snippet.splitlines()
    includes = [line for line in lines if line.startswith("#include")]
    body = [line for line in lines if not line.startswith("#include")]
    return "\n".join(includes) + "\n\nint main() {\n" + "\n".join(body) + "\n}\n"


@pytest.mark.slow
def test_cpp_blocks_build_against_the_package_and_run(tmp_path):
    [cmake_block] = blocks("cmake")
    [cpp_block] = blocks("cpp")
    (tmp_path / "CMakeLists.txt").write_text(cmake_block)
    (tmp_path / "main.cpp").write_text(cpp_program(cpp_block))
    cmake = shutil.which("cmake")
    assert cmake, "cmake is not on PATH"
    build = tmp_path / "build"

    def run(*args):
        result = subprocess.run(args, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
        return result

    run(cmake, "-S", str(tmp_path), "-B", str(build), "-G", "Ninja",
        f"-DCMAKE_PREFIX_PATH={fuseops.cmake_prefix_path}")
    run(cmake, "--build", str(build))
    # The installed library finds torch by itself: no LD_LIBRARY_PATH.
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    result = subprocess.run([str(build / "app")], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
