"""Build information, the torch version guard, CPU capabilities, CLI."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import torch

import fuseops
from fuseops import _loader

from conftest import CAPABILITY_ORDER, cpu_capabilities, cpu_runs, run_python


def test_build_info_describes_this_build():
    info = fuseops.build_info()
    assert info["version"] == fuseops.__version__
    assert info["torch_version"] == torch.__version__
    assert info["cxx11_abi"] == torch.compiled_with_cxx11_abi()
    assert info["cpu_capabilities"][0] == "DEFAULT"
    assert info["selected_cpu_capability"] in info["cpu_capabilities"]
    assert info["cuda"] == bool(info["cuda_architectures"])


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


@pytest.mark.slow
@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_each_cpu_capability_selected_and_correct(capability, tmp_path):
    if capability.upper() not in cpu_capabilities():
        pytest.fail(f"{capability} build missing: {cpu_capabilities()}")
    # Inputs are made and results checked here; the child only runs fuseops.
    # ATEN_CPU_CAPABILITY may name a build this CPU lacks: fuseops lowers its
    # choice to what the CPU runs, ATen's own kernels would not (SIGILL).
    cases = {}
    # NaN, +-Inf and -0 among the values: torch 2.13's AVX-512
    # Vectorized<Half>/<BFloat16> maximum loses NaN and changes the
    # neighbouring lanes, which relu once used.
    specials = torch.tensor([float("nan"), 1.0, 2.0, float("inf"), float("-inf"), -0.0, -1.0])
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        x = torch.randn(100003, dtype=dt)
        every_7th = x[::7]
        every_7th.copy_(specials.to(dt).repeat(every_7th.numel() // len(specials) + 1)[: every_7th.numel()])
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
    # Never above the request; exactly the request when this CPU runs it.
    assert CAPABILITY_ORDER.index(selected) <= CAPABILITY_ORDER.index(capability.upper())
    if cpu_runs(capability):
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
        assert os.path.realpath(resolved[name]) == os.path.realpath(os.path.join(torch_lib, name)), result.stdout
