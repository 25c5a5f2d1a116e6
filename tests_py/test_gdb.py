"""The gdb printers (tools/gdb) against a fixture program, driven by batch gdb.

tests_cpp/gdb/gdb_fixture.cpp holds one variable per case and stops in
fixture_stop(). gdb prints every case live, writes a core file, and prints
them again from the core file; the same cases are printed from the -O2 build
of the fixture. The output is compared line by line with EXPECTED.
gdb_fixture_no_types, a program without the torch class layouts, is printed
with the printers and types object of the installed package (PIP_EXPECTED).

The fixture programs come from FUSEOPS_GDB_FIXTURE_DIR, the folder of a
CMake build that holds them (e.g. build/dev/tests_cpp/gdb; missing ones are
built there, as they are not part of "all"); when it is not set, tests_cpp/gdb
is configured and built on its own here, in pytest's cache folder.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PRINTERS = ROOT / "tools" / "gdb" / "fuseops-gdb.py"
FIXTURE_SOURCE = ROOT / "tests_cpp" / "gdb"
MARK = "@@@ "
# CMake target -> file, in the fixture build folder.
FIXTURE_FILES = {
    "gdb_fixture": "gdb_fixture",
    "gdb_fixture_o2": "gdb_fixture_o2",
    "gdb_fixture_no_types": "gdb_fixture_no_types",
    "gdb_fixture_types": "gdb_fixture_types.so",
    "gdb_fixture_types_no_autograd": "gdb_fixture_types_no_autograd.so",
}
# Stands for an address in EXPECTED: heap addresses differ between runs.
ADDRESS = "0x@"

EXPECTED = {
    "contiguous_float": """\
Tensor float32 [2, 3] cpu
[[0., 1., 2.],
 [3., 4., 5.]]""",
    "transposed": """\
Tensor float32 [3, 2] cpu strides=[1, 3]
[[0., 3.],
 [1., 4.],
 [2., 5.]]""",
    "sliced": """\
Tensor float32 [2, 3] cpu storage_offset=3
[[3., 4., 5.],
 [6., 7., 8.]]""",
    "bf16": "Tensor bfloat16 [4] cpu = [-1.5000,  0.0000,  0.2500,  3.0000]",
    "fp16": "Tensor float16 [3] cpu = [ 1.0000e+00, -5.0000e-01,  1.0240e+03]",
    "int64": """\
Tensor int64 [2, 3] cpu
[[-3, -2, -1],
 [ 0,  1,  2]]""",
    "boolean": "Tensor bool [3] cpu = [ True, False,  True]",
    "scalar": "Tensor float64 [] cpu = 2.5000",
    "empty": "Tensor float32 [0, 3] cpu = []",
    "undefined": "Tensor undefined",
    "seven_dim": """\
Tensor int32 [1, 2, 1, 3, 1, 2, 1] cpu
[[[[[[[ 0],
      [ 1]]],


    [[[ 2],
      [ 3]]],


    [[[ 4],
      [ 5]]]]],




  [[[[[ 6],
      [ 7]]],


    [[[ 8],
      [ 9]]],


    [[[10],
      [11]]]]]]]""",
    "requires_grad": "Tensor float32 [3] cpu requires_grad=True = [1., 1., 1.]",
    "with_grad": "Tensor float32 [2] cpu requires_grad=True grad=<float32 [2] cpu> = [1., 1.]",
    "optional_tensor": "std::optional<at::Tensor> = {[contained value] = Tensor int16 [3] cpu = [0, 1, 2]}",
    "optional_empty": "std::optional<at::Tensor> [no contained value]",
    "complex": "Tensor complex64 [2] cpu = [ 1.0000+2.j, -0.5000+0.j]",
    "uint8": "Tensor uint8 [6] cpu = [250, 251, 252, 253, 254, 255]",
    "long_vector": "Tensor float32 [100] cpu = [ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., ..., "
    "90., 91., 92., 93., 94., 95., 96., 97., 98., 99.]",
    "meta": "Tensor float32 [2, 3] meta <no values: a meta tensor has no data>",
    "cuda": "Tensor float32 [4] cuda:0 <no values: cuda:0 memory is not readable from gdb>",
    "symbolic": "Tensor float32 [<symbolic>, 3] meta strides=[3, 1] <no values: symbolic sizes>",
    "int_array_ref": "c10::ArrayRef of length 2 = {2, 3}",
    "small_vector": "c10::SmallVector of length 3, capacity 5 = {4, 5, 6}",
    "cpu_device": "cpu",
    "cuda_device": "cuda:1",
    "scalar_type": "BFloat16 (bfloat16)",
    "type_meta": "float64",
    "sym_int": "42",
    "storage": "Storage of 24 bytes on cpu at 0x@",
    "impl_pointer": "0x@ -> TensorImpl float32 [2, 3] cpu",
    # Garbage: one short line each, never a hang or a flood.
    "garbage_tensor": "<invalid Tensor: cannot access memory at address 0x@>",
    "garbage_impl": "0x@ -> <invalid TensorImpl: dtype #32639>",
}

# Checked in the live session only: commands, settings, the collection.
EXTRA = {
    "deref_pointer": (
        "output *impl_pointer\necho \\n",
        """\
TensorImpl float32 [2, 3] cpu
[[0., 1., 2.],
 [3., 4., 5.]]""",
    ),
    "deref_garbage": ("output *garbage_impl\necho \\n", "<invalid TensorImpl: dtype #32639>"),
    "command_limit": (
        "fuseops-tensor long_vector 6",
        "Tensor float32 [100] cpu = [ 0.,  1.,  2., ..., 97., 98., 99.]",
    ),
    "command_pointer": (
        "fuseops-tensor &transposed",
        """\
Tensor float32 [3, 2] cpu strides=[1, 3]
[[0., 3.],
 [1., 4.],
 [2., 5.]]""",
    ),
    "command_grad": ("fuseops-tensor -grad with_grad", "Tensor float32 [2] cpu = [0.2500, 0.2500]"),
    # uint8 has no autograd metadata at all, contiguous_float (a view) an undefined grad.
    "command_no_grad": (
        "fuseops-tensor -grad uint8\nfuseops-tensor -grad contiguous_float",
        "Tensor undefined\nTensor undefined",
    ),
    "command_optional": ("fuseops-tensor optional_tensor", "Tensor int16 [3] cpu = [0, 1, 2]"),
    "command_all_values": ("fuseops-tensor long_vector 0", None),
    # A failing command would end the batch script: catch its error.
    "command_non_tensor": (
        "python\ntry:\n    gdb.execute('fuseops-tensor cpu_device')\nexcept gdb.error as error:\n"
        "    print(error)\nend",
        None,
    ),
    "setting": (
        "set fuseops-max-elements 4\noutput long_vector\necho \\n\nshow fuseops-max-elements\n"
        "output int64\necho \\n\nset fuseops-max-elements 20",
        """\
Tensor float32 [100] cpu = [ 0.,  1., ..., 98., 99.]
The fuseops tensor printers show at most 4 values of a tensor.
Tensor int64 [2, 3] cpu
[[-3, ..., -1],
 [ 0, ...,  2]]""",
    ),
    "layout_error": (
        "python from fuseops_gdb import _layout, formatting\n"
        "python print(formatting.safe('at::Tensor', "
        "lambda: _layout.member(gdb.parse_and_eval('contiguous_float'), 'sizes_')))",
        "<at::Tensor: at::Tensor has no field 'sizes_' (renamed in this torch version?); "
        "the fuseops printers need updating>",
    ),
}


def _gdb() -> str:
    gdb = shutil.which("gdb")
    if gdb is None:
        pytest.fail("gdb is not installed; the printer tests need it (apt-get install gdb)")
    return gdb


def _run(command: list[str], what: str, timeout: float) -> subprocess.CompletedProcess:
    result = subprocess.run(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )
    if result.returncode != 0:
        pytest.fail(f"{what} failed ({result.returncode}):\n{result.stdout[-4000:]}")
    return result


@pytest.fixture(scope="module")
def fixture_dir(request: pytest.FixtureRequest) -> Path:
    configured = os.environ.get("FUSEOPS_GDB_FIXTURE_DIR")
    cmake = shutil.which("cmake")
    if configured:
        directory = Path(configured).resolve()
        # Inside the fuseops build the fixtures are not part of "all": build
        # them in the CMake build folder that holds this one.
        top = next(
            (d for d in (directory, *directory.parents) if (d / "CMakeCache.txt").is_file()), None
        )
        missing = [name for name in FIXTURE_FILES.values() if not (directory / name).is_file()]
        if missing and top is not None and cmake is not None:
            _run(
                [cmake, "--build", str(top), "--target", *FIXTURE_FILES],
                "building the gdb fixture",
                timeout=1200,
            )
    else:
        if cmake is None:
            pytest.fail("cmake is needed to build the gdb fixture (or set FUSEOPS_GDB_FIXTURE_DIR)")
        key = hashlib.sha256(f"{sys.executable}\n{ROOT}".encode()).hexdigest()[:12]
        directory = request.config.cache.mkdir("fuseops-gdb-fixture") / key
        # A configure that failed (interrupted, a missing tool since
        # installed) leaves a cache but no build files: start it over.
        if not any((directory / name).exists() for name in ("build.ninja", "Makefile")):
            (directory / "CMakeCache.txt").unlink(missing_ok=True)
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            _run(
                [
                    cmake,
                    "-S",
                    str(FIXTURE_SOURCE),
                    "-B",
                    str(directory),
                    *generator,
                    "-DCMAKE_BUILD_TYPE=Release",
                    f"-DPython_EXECUTABLE={sys.executable}",
                ],
                "configuring the gdb fixture",
                timeout=600,
            )
        _run(
            [cmake, "--build", str(directory), "--target", *FIXTURE_FILES],
            "building the gdb fixture",
            timeout=1200,
        )
    for name in FIXTURE_FILES.values():
        if not (directory / name).is_file():
            pytest.fail(f"{directory / name} is missing (FUSEOPS_GDB_FIXTURE_DIR={configured!r})")
    return directory


def _script(live: bool, core: Path | None, extras: bool) -> str:
    lines = [
        "set pagination off",
        "set width 0",
        "set confirm off",
        "set style enabled off",
        f"source {PRINTERS}",
    ]
    if live:
        lines += ["break fixture_stop", "run"]
    # libstdc++'s own printers (std::optional) load with its symbols.
    lines += ["sharedlibrary libstdc++", "up"]
    for case in EXPECTED:
        lines += [f"echo {MARK}{case}\\n", f"output {case}", "echo \\n"]
    if extras:
        for case, (commands, _) in EXTRA.items():
            lines += [f"echo {MARK}{case}\\n", *commands.splitlines()]
        lines += [
            f"echo {MARK}info\\n",
            "info pretty-printer global fuseops",
            f"echo {MARK}disabled\\n",
            "disable pretty-printer global fuseops",
            "output contiguous_float",
            "echo \\n",
            "enable pretty-printer global fuseops",
        ]
    if core is not None:
        lines += [f"echo {MARK}core\\n", f"generate-core-file {core}"]
    lines += [f"echo {MARK}end\\n"]
    if live:
        lines += ["kill"]
    return "\n".join(lines) + "\n"


def _sections(output: str) -> dict[str, str]:
    sections: dict[str, list[str]] = {}
    current = None
    for line in output.splitlines():
        if line.startswith(MARK):
            current = line[len(MARK) :]
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {name: "\n".join(lines) for name, lines in sections.items()}


class GdbRun:
    def __init__(
        self,
        gdb: str,
        binary: Path,
        workdir: Path,
        name: str,
        core: Path | None = None,
        write_core: Path | None = None,
        extras: bool = False,
        text: str | None = None,
        solibs: bool = False,
    ):
        script = workdir / f"{name}.gdb"
        script.write_text(text or _script(live=core is None, core=write_core, extras=extras))
        # Without shared library symbols gdb starts in under a second.
        startup = [] if solibs else ["-iex", "set auto-solib-add off"]
        command = [gdb, "-nx", "-batch", *startup, "-x", str(script), str(binary)]
        if core is not None:
            command.append(str(core))
        started = time.monotonic()
        result = subprocess.run(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120
        )
        self.seconds = time.monotonic() - started
        self.output = result.stdout
        self.sections = _sections(result.stdout)
        if "end" not in self.sections:
            pytest.fail(f"gdb ({name}) did not reach the end of its script:\n{self.output[-4000:]}")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gdb")


@pytest.fixture(scope="module")
def runs(fixture_dir: Path, workdir: Path) -> dict[str, GdbRun]:
    gdb = _gdb()
    core = workdir / "gdb_fixture.core"
    live = GdbRun(gdb, fixture_dir / "gdb_fixture", workdir, "live", write_core=core, extras=True)
    if not core.is_file():
        pytest.fail(
            f"generate-core-file wrote no core file:\n{live.sections.get('core', live.output[-2000:])}"
        )
    try:
        from_core = GdbRun(gdb, fixture_dir / "gdb_fixture", workdir, "core", core=core)
    finally:
        core.unlink()  # ~400 MB
    optimized = GdbRun(gdb, fixture_dir / "gdb_fixture_o2", workdir, "O2")
    return {"live": live, "core": from_core, "O2": optimized}


def _assert_matches(actual: str | None, expected: str, what: str) -> None:
    assert actual is not None, f"{what}: no output"
    actual_lines = actual.splitlines()
    expected_lines = expected.splitlines()
    for number, (got, want) in enumerate(zip(actual_lines, expected_lines), 1):
        pattern = re.escape(want).replace(re.escape(ADDRESS), "0x[0-9a-f]+")
        assert re.fullmatch(pattern, got), (
            f"{what}, line {number}:\n  got:      {got!r}\n  expected: {want!r}\n{actual}"
        )
    assert len(actual_lines) == len(expected_lines), (
        f"{what}: {len(actual_lines)} lines, expected {len(expected_lines)}:\n{actual}"
    )


@pytest.mark.parametrize("mode", ["live", "core", "O2"])
@pytest.mark.parametrize("case", list(EXPECTED))
def test_printer(runs: dict[str, GdbRun], mode: str, case: str) -> None:
    _assert_matches(runs[mode].sections.get(case), EXPECTED[case], f"{case} ({mode})")


@pytest.mark.parametrize(
    "case", [name for name, (_, expected) in EXTRA.items() if expected is not None]
)
def test_commands_and_settings(runs: dict[str, GdbRun], case: str) -> None:
    _assert_matches(runs["live"].sections.get(case), EXTRA[case][1], case)


def test_command_shows_all_values_when_asked(runs: dict[str, GdbRun]) -> None:
    text = runs["live"].sections["command_all_values"]
    assert "..." not in text and text.count(",") == 99 and text.endswith("98., 99.]"), text


def test_command_rejects_non_tensor(runs: dict[str, GdbRun]) -> None:
    assert (
        "fuseops-tensor: c10::Device is not a tensor" in runs["live"].sections["command_non_tensor"]
    )


def test_garbage_stays_short(runs: dict[str, GdbRun]) -> None:
    for mode, run in runs.items():
        for case in ("garbage_tensor", "garbage_impl"):
            text = run.sections[case]
            assert "\n" not in text and len(text) < 120, f"{case} ({mode}): {text!r}"


def test_collection_is_named_and_can_be_disabled(runs: dict[str, GdbRun]) -> None:
    listing = runs["live"].sections["info"]
    assert "fuseops" in listing and "at::Tensor" in listing and "c10::TensorImpl" in listing
    raw = runs["live"].sections["disabled"]
    assert "impl_" in raw and "Tensor float32" not in raw


def test_gdb_runs_fit_the_time_budget(runs: dict[str, GdbRun]) -> None:
    seconds = {mode: round(run.seconds, 1) for mode, run in runs.items()}
    assert sum(seconds.values()) < 60, seconds


def test_gdb_init_lines_load_the_printers(fixture_dir: Path) -> None:
    from fuseops.gdb import gdb_init_lines

    lines = gdb_init_lines()
    commands = [line for line in lines if line.strip() and not line.startswith("#")]
    assert any(line.startswith("source ") for line in commands), lines
    arguments = [argument for line in commands for argument in ("-ex", line)]
    result = _run(
        [
            _gdb(),
            "-nx",
            "-batch",
            *arguments,
            "-ex",
            "info pretty-printer global fuseops",
            "-ex",
            "show fuseops-max-elements",
        ],
        "gdb with the gdb-init lines",
        timeout=60,
    )
    assert "fuseops" in result.stdout and "at most 20 values" in result.stdout, result.stdout


# The pip path: gdb_fixture_no_types has no torch layouts of its own, as a
# pip user's program; the printers and the types object come from the
# installed package, found through `python -m fuseops gdb-init`. No
# `set auto-solib-add off` here: only with torch's symbols loaded can gdb
# find the dynamic type of a polymorphic object, and warn about one the types
# object does not describe (a view's DifferentiableViewMeta).
PIP_EXPECTED = {
    "undefined": "Tensor undefined",
    "contiguous_float": EXPECTED["contiguous_float"],
    "transposed": EXPECTED["transposed"],
    "with_grad": "Tensor float32 [3] cpu requires_grad=True grad=<float32 [3] cpu> = [1., 1., 1.]",
    "without_grad": "Tensor float64 [2] cpu requires_grad=True = [0., 0.]",
}
PIP_COMMANDS = {
    "grad": ("fuseops-tensor -grad with_grad", "Tensor float32 [3] cpu = [0.5000, 0.5000, 0.5000]"),
    "grad_undefined": ("fuseops-tensor -grad without_grad", "Tensor undefined"),
}


@pytest.fixture(scope="module")
def installed_printers() -> tuple[list[str], Path]:
    """The gdb-init lines of the installed fuseops, and its printers folder."""
    result = _run(
        [sys.executable, "-m", "fuseops", "gdb-init"], "python -m fuseops gdb-init", timeout=120
    )
    lines = result.stdout.splitlines()
    sources = [Path(line.split(None, 1)[1]) for line in lines if line.startswith("source ")]
    assert len(sources) == 1, lines
    printers = sources[0].parent
    assert printers != PRINTERS.parent, (
        f"gdb-init names the checkout's printers, not an installed package: {lines}"
    )
    assert (printers / "fuseops_gdb_types.so").is_file(), f"no types object beside {sources[0]}"
    return [line for line in lines if line.strip() and not line.startswith("#")], printers


def _pip_script(init_lines: list[str], live: bool, core: Path | None) -> str:
    lines = [
        "set pagination off",
        "set width 0",
        "set confirm off",
        "set style enabled off",
        *init_lines,
    ]
    if live:
        lines += ["break fixture_stop", "run"]
    lines += ["up"]
    # Before the layouts are loaded: an undefined tensor needs none.
    lines += [
        f"echo {MARK}before_undefined\\n",
        "output undefined",
        "echo \\n",
        f"echo {MARK}before\\n",
        "output contiguous_float",
        "echo \\n",
        f"echo {MARK}load\\n",
        "fuseops-load-types",
    ]
    for case in PIP_EXPECTED:
        lines += [f"echo {MARK}{case}\\n", f"output {case}", "echo \\n"]
    for case, (command, _) in PIP_COMMANDS.items():
        lines += [f"echo {MARK}{case}\\n", command]
    if core is not None:
        lines += [f"echo {MARK}core\\n", f"generate-core-file {core}"]
    lines += [f"echo {MARK}end\\n"]
    if live:
        lines += ["kill"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def pip_runs(fixture_dir: Path, workdir: Path, installed_printers) -> dict[str, GdbRun]:
    gdb = _gdb()
    init_lines, _ = installed_printers
    binary = fixture_dir / "gdb_fixture_no_types"
    core = workdir / "gdb_fixture_no_types.core"
    live = GdbRun(
        gdb, binary, workdir, "pip_live", text=_pip_script(init_lines, True, core), solibs=True
    )
    if not core.is_file():
        pytest.fail(
            f"generate-core-file wrote no core file:\n{live.sections.get('core', live.output[-2000:])}"
        )
    try:
        from_core = GdbRun(
            gdb,
            binary,
            workdir,
            "pip_core",
            core=core,
            text=_pip_script(init_lines, False, None),
            solibs=True,
        )
    finally:
        core.unlink()
    return {"live": live, "core": from_core}


@pytest.mark.parametrize("mode", ["live", "core"])
@pytest.mark.parametrize("case", [*PIP_EXPECTED, *PIP_COMMANDS])
def test_pip_install_printers(
    pip_runs: dict[str, GdbRun], installed_printers, mode: str, case: str
) -> None:
    expected = PIP_EXPECTED[case] if case in PIP_EXPECTED else PIP_COMMANDS[case][1]
    _assert_matches(
        pip_runs[mode].sections.get(case), expected, f"{case} ({mode}, installed printers)"
    )


@pytest.mark.parametrize("mode", ["live", "core"])
def test_pip_install_names_missing_layouts_then_loads_them(
    pip_runs: dict[str, GdbRun], installed_printers, mode: str
) -> None:
    run = pip_runs[mode]
    _, printers = installed_printers
    assert run.sections["before_undefined"] == "Tensor undefined", run.output
    assert run.sections["before"] == (
        "<Tensor: c10::TensorImpl has no layout: the program's debug information only declares it; "
        f'run `fuseops-load-types` (see {printers / "README.md"}, "Type information")>'
    ), run.output
    assert run.sections["load"] == (
        f"fuseops: loaded the torch type layouts from {printers / 'fuseops_gdb_types.so'}"
    ), run.output
    # generate-core-file warns about the vsyscall page, which is no printer's doing.
    printed = "\n".join(text for name, text in run.sections.items() if name != "core")
    assert "warning" not in printed.lower(), run.output


def _load_types_session(
    fixture_dir: Path,
    workdir: Path,
    name: str,
    types_object: Path,
    cases: list[str],
    commands: tuple[str, ...] = (),
) -> GdbRun:
    # fuseops-load-types fails when layouts are missing; catch its error, as
    # a failing command would end the batch script.
    text = (
        "\n".join(
            [
                "set pagination off",
                "set confirm off",
                "set style enabled off",
                f"source {PRINTERS}",
                "break fixture_stop",
                "run",
                "up",
                f"echo {MARK}load\\n",
                "python\ntry:\n"
                f"    gdb.execute('fuseops-load-types {types_object}')\n"
                "except gdb.error as error:\n    print(error)\nend",
                *[
                    line
                    for case in cases
                    for line in (f"echo {MARK}{case}\\n", f"output {case}", "echo \\n")
                ],
                *[line for command in commands for line in (f"echo {MARK}{command}\\n", command)],
                f"echo {MARK}end\\n",
                "kill",
            ]
        )
        + "\n"
    )
    return GdbRun(
        _gdb(), fixture_dir / "gdb_fixture_no_types", workdir, name, text=text, solibs=True
    )


def test_load_types_names_a_stripped_types_object(fixture_dir: Path, workdir: Path) -> None:
    strip = shutil.which("strip")
    if strip is None:
        pytest.fail("strip (binutils) is needed to make a stripped types object")
    stripped = workdir / "stripped_types.so"
    _run(
        [strip, "--strip-debug", "-o", str(stripped), str(fixture_dir / "gdb_fixture_types.so")],
        "strip",
        timeout=60,
    )
    run = _load_types_session(fixture_dir, workdir, "stripped", stripped, ["undefined"])
    assert run.sections["load"] == (
        f"fuseops-load-types: added the symbols of {stripped} (it has no debug information: stripped), "
        "but the printers still lack the layout of c10::TensorImpl: not described; "
        "c10::StorageImpl: not described; torch::autograd::AutogradMeta: not described"
    ), run.output
    assert run.sections["undefined"] == "Tensor undefined", run.output


def test_without_autograd_layout_only_autograd_is_unknown(fixture_dir: Path, workdir: Path) -> None:
    types_object = fixture_dir / "gdb_fixture_types_no_autograd.so"
    grad = "fuseops-tensor -grad with_grad"
    run = _load_types_session(
        fixture_dir,
        workdir,
        "no_autograd",
        types_object,
        ["transposed", "with_grad", "undefined"],
        (grad,),
    )
    assert run.sections["load"] == (
        f"fuseops-load-types: added the symbols of {types_object}, but the printers still lack "
        "the layout of torch::autograd::AutogradMeta: not described"
    ), run.output
    _assert_matches(
        run.sections["transposed"],
        """\
Tensor float32 [3, 2] cpu strides=[1, 3] requires_grad=?
[[0., 3.],
 [1., 4.],
 [2., 5.]]""",
        "transposed",
    )
    _assert_matches(
        run.sections["with_grad"],
        "Tensor float32 [3] cpu requires_grad=? = [1., 1., 1.]",
        "with_grad",
    )
    _assert_matches(run.sections["undefined"], "Tensor undefined", "undefined")
    assert run.sections[grad] == (
        "<tensor: the grad is unknown: torch::autograd::AutogradMeta has no layout; run "
        f'`fuseops-load-types` (see {PRINTERS.parent / "README.md"}, "Type information")>'
    ), run.output
    assert "warning" not in run.output.lower(), run.output
