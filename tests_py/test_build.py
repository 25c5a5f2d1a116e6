"""Build information, the import guards (torch version, CPU, damaged
install), configure-time errors, CPU capabilities, CLI."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import fuseops
from fuseops import _loader

from support.cpu_builds import cpu_capabilities, cpu_runs
from support.processes import run_python


def test_build_info_describes_this_build():
    info = fuseops.build_info()
    assert info["version"] == fuseops.__version__
    assert info["torch_version"] == torch.__version__
    assert info["cxx11_abi"] == torch.compiled_with_cxx11_abi()
    assert info["cpu_capabilities"][0] == "DEFAULT"
    assert info["selected_cpu_capability"] in info["cpu_capabilities"]
    assert info["cuda"] == bool(info["cuda_architectures"])
    # A CUDA build states that its kernels are unverified until the GPU check
    # has passed, and how to run it; a CPU build has no CUDA status.
    if info["cuda"]:
        assert info["cuda_status"].startswith("experimental")
        assert "tools/gpu_check.sh" in info["cuda_status"]
    else:
        assert info["cuda_status"] == ""


def test_info_states_the_cuda_status_of_a_cuda_build():
    result = run_python("import sys; from fuseops.__main__ import main; sys.exit(main(['info']))")
    assert result.returncode == 0, result.stderr
    status_lines = [line for line in result.stdout.splitlines() if line.startswith("CUDA status")]
    if fuseops.build_info()["cuda"]:
        assert status_lines and "tools/gpu_check.sh" in status_lines[0], result.stdout
    else:
        assert not status_lines, result.stdout


def test_version_guard_accepts_the_same_version():
    _loader.check_torch_version("2.13.0+cpu", "2.13.0+cpu")


def test_version_guard_message_names_versions_and_fix():
    with pytest.raises(ImportError) as info:
        _loader.check_torch_version("2.13.0+cpu", "2.14.1+cu130")
    message = str(info.value)
    assert "built against torch 2.13.0+cpu" in message
    assert "torch 2.14.1+cu130 is installed" in message
    assert "pip install --no-build-isolation" in message


def test_import_with_another_torch_fails_clearly():
    # Pretend the running torch is another release: the import must stop
    # before the library is loaded, with the guard's message.
    result = run_python(
        "import torch; torch.__version__ = '1.0.0'\n"
        "try:\n"
        "    import fuseops\n"
        "except ImportError as e:\n"
        "    print('IMPORT-ERROR:', e)\n"
    )
    assert result.returncode == 0, result.stderr
    assert "IMPORT-ERROR: fuseops was built against torch" in result.stdout
    assert "torch 1.0.0 is installed" in result.stdout
    assert "undefined symbol" not in result.stdout + result.stderr


def test_cpu_guard_accepts_a_capability_the_cpu_runs():
    _loader.check_cpu_capability("AVX512", runs=True)


def test_cpu_guard_message_names_the_setting_and_the_fix(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")
    with pytest.raises(ImportError) as info:
        _loader.check_cpu_capability("AVX512", runs=False)
    assert isinstance(info.value, _loader.UnsupportedCpuError)
    message = str(info.value)
    assert "its AVX512 CPU kernels (ATEN_CPU_CAPABILITY='avx512')" in message
    assert "this CPU does not support AVX512" in message
    assert "Unset ATEN_CPU_CAPABILITY" in message
    assert "default" in message


@pytest.mark.parametrize("naming", [0, 1])
def test_cpu_guard_reads_the_features_each_build_needs(naming):
    # Feature names as torch's cpuinfo (0) and /proc/cpuinfo (1) spell them.
    avx2 = [("avx2", "fma3"), ("avx2", "fma")][naming]
    avx512 = [
        ("avx512_f", "avx512_bw", "avx512_vl", "avx512_dq"),
        ("avx512f", "avx512bw", "avx512vl", "avx512dq"),
    ][naming]
    sse = ({"sse2"}, naming)
    assert _loader.cpu_runs("DEFAULT", sse)
    assert not _loader.cpu_runs("AVX2", sse)
    assert _loader.cpu_runs("AVX2", (set(avx2), naming))
    assert not _loader.cpu_runs("AVX2", ({avx2[0]}, naming))  # FMA missing
    assert not _loader.cpu_runs("AVX512", (set(avx2), naming))
    assert not _loader.cpu_runs("AVX512", (set(avx2) | set(avx512[:3]), naming))  # no DQ
    assert _loader.cpu_runs("AVX512", (set(avx2) | set(avx512), naming))


def test_cpu_guard_agrees_with_the_library_on_this_cpu():
    # Two judgements of one CPU: the guard's (before the library is loaded)
    # and the library's own CPUID check.
    runnable = fuseops.build_info()["runnable_cpu_capabilities"]
    for capability in cpu_capabilities():
        assert _loader.cpu_runs(capability) == (capability in runnable), capability


def test_import_forced_onto_kernels_the_cpu_lacks_fails_clearly():
    # A CPU without AVX-512, as torch's CPU probe reports it, with ATen forced
    # to its AVX512 kernels: the import stops before the library is loaded.
    result = run_python(
        "import torch\n"
        "probe = torch._C._cpu._get_cpu_capability\n"
        "torch._C._cpu._get_cpu_capability = lambda: {\n"
        "    k: (False if k.startswith('avx512') else v) for k, v in probe().items()}\n"
        "try:\n"
        "    import fuseops\n"
        "except ImportError as e:\n"
        "    print('IMPORT-ERROR:', type(e).__name__, e)\n"
        "print('LOADED:', [p for p in torch.ops.loaded_libraries if 'fuseops' in p])\n",
        {"ATEN_CPU_CAPABILITY": "avx512"},
    )
    assert result.returncode == 0, result.stderr
    assert (
        "IMPORT-ERROR: UnsupportedCpuError fuseops: PyTorch is set to run its AVX512"
        in result.stdout
    )
    assert "or set it to one of: default, avx2." in result.stdout
    assert "LOADED: []" in result.stdout


def _copy_of_the_package(tmp_path, library: bytes | None) -> str:
    """A copy of the installed Python package in tmp_path/site, without its
    C++ library (library None) or with `library` as its contents."""
    site = tmp_path / "site"
    package = os.path.dirname(fuseops.__file__)
    shutil.copytree(
        package,
        site / "fuseops",
        ignore=shutil.ignore_patterns("lib", "include", "share", "__pycache__"),
    )
    if library is not None:
        (site / "fuseops" / "lib").mkdir()
        (site / "fuseops" / "lib" / "libfuseops.so").write_bytes(library)
    return str(site)


def _import_error(pythonpath: str) -> str:
    result = run_python(
        "import fuseops\nprint('IMPORTED', fuseops.__file__)\n",
        {"PYTHONPATH": pythonpath},
    )
    assert result.returncode != 0, result.stdout
    # The last exception of the traceback, all its lines.
    assert "\nImportError: " in result.stderr, result.stderr
    return result.stderr[result.stderr.rindex("\nImportError: ") + 1 :]


def test_import_without_the_library_file_says_to_reinstall(tmp_path):
    error = _import_error(_copy_of_the_package(tmp_path, library=None))
    assert error.startswith("ImportError: fuseops: its C++ library ")
    assert "libfuseops.so is missing" in error
    assert "pip install --no-build-isolation --force-reinstall" in error


def test_import_with_a_damaged_library_says_to_reinstall(tmp_path):
    error = _import_error(_copy_of_the_package(tmp_path, library=b"not a shared object"))
    assert error.startswith("ImportError: fuseops: cannot load its C++ library ")
    assert "pip install --no-build-isolation --force-reinstall" in error


def test_import_of_the_unbuilt_source_tree_says_to_build(tmp_path):
    source = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
    error = _import_error(source)
    assert error.startswith("ImportError: fuseops is not built:")
    assert "pip install --no-build-isolation ." in error


SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _configure(
    build_dir,
    *args: str,
    cmake: str | None = None,
    python: str = sys.executable,
    env: dict | None = None,
):
    """Configures fuseops (no build) and returns CMake's result."""
    if cmake is None:
        cmake = shutil.which("cmake", path=os.path.dirname(sys.executable))
    command = [
        cmake,
        "-S",
        SOURCE_DIR,
        "-B",
        str(build_dir),
        "-G",
        "Ninja",
        f"-DPython_EXECUTABLE={python}",
        *args,
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def _cmake_version(cmake: str) -> tuple[int, int]:
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"version (\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


@pytest.mark.slow
def test_configure_with_cmake_older_than_3_26_fails_clearly(tmp_path):
    old = [
        c
        for c in ("/usr/bin/cmake", "/usr/local/bin/cmake")
        if os.access(c, os.X_OK) and (3, 0) <= _cmake_version(c) < (3, 26)
    ]
    if not old:
        pytest.skip("no CMake older than 3.26 on this machine (Debian 12's /usr/bin/cmake is 3.25)")
    result = _configure(tmp_path, cmake=old[0])
    assert result.returncode != 0
    assert "fuseops needs CMake 3.26 or newer; this is CMake 3." in result.stderr, result.stderr
    assert 'pip install "cmake>=3.26"' in result.stderr


@pytest.mark.slow
def test_configure_without_a_cxx20_compiler_fails_clearly(tmp_path):
    # g++ whose C++20 mode is C++17: what an older compiler that accepts the
    # flag but lacks the language gives.
    fake = tmp_path / "g++-cxx17"
    fake.write_text(
        "#!/bin/bash\n"
        "args=()\n"
        'for a in "$@"; do\n'
        '  case "$a" in -std=c++2*|-std=gnu++2*) args+=(-std=c++17) ;; *) args+=("$a") ;; esac\n'
        "done\n"
        'exec g++ "${args[@]}"\n'
    )
    fake.chmod(0o755)
    result = _configure(tmp_path / "build", f"-DCMAKE_CXX_COMPILER={fake}")
    assert result.returncode != 0
    assert "fuseops needs a C++20 compiler" in result.stderr, result.stderr
    assert "GNU" in result.stderr and str(fake) in result.stderr
    assert "-DCMAKE_CXX_COMPILER=<path>" in result.stderr
    # It stops there, before looking for torch.
    assert "fuseops: torch" not in result.stdout


@pytest.mark.slow
def test_configure_cuda_on_with_cpu_only_torch_fails_clearly(tmp_path):
    result = _configure(tmp_path, "-DFUSEOPS_CUDA=ON")
    assert result.returncode != 0
    assert f"FUSEOPS_CUDA=ON but torch {torch.__version__}" in result.stderr, result.stderr
    assert "is a CPU-only build" in result.stderr
    assert "-DFUSEOPS_CUDA=OFF" in result.stderr


@pytest.mark.slow
def test_configure_cuda_on_without_the_toolkit_fails_clearly(tmp_path):
    # torch reporting CUDA 13.0 (the lookup of fuseops_locate_torch sees a
    # patched torch.version.cuda) and the nvcc CUDACXX names absent.
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/bash\n"
        'if [ "$1" = -c ] && [[ "$2" == *cmake_prefix_path* ]]; then\n'
        f"  exec {sys.executable} -c \"import torch.version; torch.version.cuda = '13.0'\n$2\"\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env["CUDACXX"] = str(tmp_path / "no-toolkit" / "bin" / "nvcc")
    result = _configure(tmp_path / "build", "-DFUSEOPS_CUDA=ON", python=str(python), env=env)
    assert result.returncode != 0
    assert "fuseops: torch" in result.stdout and "(CUDA: 13.0)" in result.stdout, result.stdout
    assert "FUSEOPS_CUDA=ON but no CUDA compiler (nvcc) was found" in result.stderr, result.stderr
    assert "uses CUDA 13.0" in result.stderr
    assert "-DFUSEOPS_CUDA=OFF" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_each_cpu_capability_selected_and_correct(capability, tmp_path):
    if capability.upper() not in cpu_capabilities():
        pytest.fail(f"{capability} build missing: {cpu_capabilities()}")
    # Inputs are made and results checked here; the child only runs fuseops.
    cases = {}
    # NaN, +-Inf and -0 among the values: torch 2.13's AVX-512
    # Vectorized<Half>/<BFloat16> maximum loses NaN and changes the
    # neighbouring lanes, which relu once used.
    specials = torch.tensor([float("nan"), 1.0, 2.0, float("inf"), float("-inf"), -0.0, -1.0])
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        x = torch.randn(100003, dtype=dt)
        every_7th = x[::7]
        every_7th.copy_(
            specials.to(dt).repeat(every_7th.numel() // len(specials) + 1)[: every_7th.numel()]
        )
        cases[str(dt)] = (x, torch.randn(100003, dtype=dt))
    torch.save(cases, tmp_path / "cases.pt")
    code = (
        "import torch, fuseops\n"
        f"cases = torch.load({str(tmp_path / 'cases.pt')!r})\n"
        "results = {}\n"
        "for name, (x, g) in cases.items():\n"
        "    y = fuseops.relu(x)\n"
        "    results[name] = (y, fuseops.relu_backward(g, y))\n"
        f"torch.save(results, {str(tmp_path / 'results.pt')!r})\n"
        "print(fuseops.build_info()['selected_cpu_capability'])\n"
    )
    result = run_python(code, {"ATEN_CPU_CAPABILITY": capability})
    if not cpu_runs(capability):
        # ATen does not lower a forced capability the CPU lacks (its own
        # kernels would die of SIGILL): the import refuses it.
        assert result.returncode != 0
        assert "UnsupportedCpuError" in result.stderr, result.stderr
        assert "Unset ATEN_CPU_CAPABILITY" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    results = torch.load(tmp_path / "results.pt")
    for name, (x, g) in cases.items():
        y, grad = results[name]
        # Exact: relu keeps x where x > 0 or x is NaN; the gradient passes
        # where the result is > 0 or NaN.
        passes = (x > 0) | x.isnan()
        torch.testing.assert_close(y, torch.where(passes, x, 0), rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(grad, torch.where(passes, g, 0), rtol=0, atol=0)
    selected = result.stdout.strip().splitlines()[-1]
    assert selected == capability.upper()


def test_cli_info_prints_the_build():
    result = run_python("from fuseops.__main__ import main; raise SystemExit(main(['info']))")
    assert result.returncode == 0, result.stderr
    assert f"fuseops              {fuseops.__version__}" in result.stdout
    assert "CPU build in use" in result.stdout


def test_cmake_prefix_path_holds_the_package_config():
    assert os.path.isfile(os.path.join(fuseops.cmake_prefix_path, "fuseops", "fuseopsConfig.cmake"))
    assert os.path.isfile(os.path.join(fuseops.include_dir, "fuseops", "fuseops.h"))
    assert os.path.isfile(fuseops.library_path)


def test_runnable_builds_agree_with_proc_cpuinfo():
    """The per-build tests skip exactly the builds fuseops says this CPU
    cannot execute; check that judgement against the kernel's CPU flags."""
    flags = set()
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if not flags:
        pytest.skip("/proc/cpuinfo lists no CPU flags on this machine")
    runs = {"DEFAULT"}
    if {"avx2", "fma"} <= flags:
        runs.add("AVX2")
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            runs.add("AVX512")
    expected = [cap for cap in cpu_capabilities() if cap in runs]
    assert fuseops.build_info()["runnable_cpu_capabilities"] == expected


@pytest.mark.slow
def test_configure_with_a_compiler_that_links_libstdcxx_statically_warns(tmp_path):
    # g++ that finds no shared libstdc++.so: what a toolchain built without it
    # gives. Such a library carries its own C++ runtime beside torch's, and
    # every error message crashed on such a build.
    fake = tmp_path / "g++-static-runtime"
    fake.write_text(
        "#!/bin/bash\n"
        'if [ "$1" = -print-file-name=libstdc++.so ]; then echo libstdc++.so; exit 0; fi\n'
        'exec g++ "$@"\n'
    )
    fake.chmod(0o755)
    result = _configure(tmp_path / "build", f"-DCMAKE_CXX_COMPILER={fake}")
    message = " ".join(result.stderr.split())
    assert "would link libstdc++ statically into libfuseops.so" in message, result.stderr
    assert "CXX=/usr/bin/g++" in message


def test_library_shares_torchs_cxx_runtime():
    # DT_NEEDED names the shared libstdc++ and the library defines none of
    # its symbols (std::ostream::_M_insert<long> stands for them all).
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.fail("readelf (binutils, installed with g++) is needed to read the library")
    dynamic = subprocess.run(
        [readelf, "-dW", fuseops.library_path], capture_output=True, text=True, check=True
    ).stdout
    assert "[libstdc++.so.6]" in dynamic, dynamic
    symbols = subprocess.run(
        [readelf, "-sW", fuseops.library_path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    defined = [
        line
        for line in symbols.splitlines()
        if "_ZNSo9_M_insertIlEERSoT_" in line and " UND " not in line
    ]
    assert not defined, defined


def test_installed_library_finds_torch_and_its_openmp_runtime():
    # Through the library's RUNPATH alone: a libgomp.so.1 found elsewhere
    # first (the system's) would become the OpenMP runtime of torch too.
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    result = subprocess.run(["ldd", fuseops.library_path], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "not found" not in result.stdout, result.stdout
    resolved = dict(re.findall(r"^\s*(\S+) => (\S+)", result.stdout, flags=re.M))
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    for name in ("libtorch_cpu.so", "libc10.so", "libgomp.so.1"):
        assert os.path.realpath(resolved[name]) == os.path.realpath(
            os.path.join(torch_lib, name)
        ), result.stdout
