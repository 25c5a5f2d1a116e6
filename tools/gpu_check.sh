#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU whose Python already has a CUDA
# build of torch: builds fuseops with its CUDA kernels against that torch (in a
# virtualenv that sees the interpreter's packages, so no torch is installed),
# then runs ctest, the pytest suite and the quick benchmark on the GPU.
# Every log and result goes into one folder, $OUT when set, else gpu-results/;
# summary.txt there lists each step. Exits non-zero if any step failed.
#
# What it tests is the CUDA side: the pytest run keeps the tests whose id
# names CUDA (every op's conformance samples, numerics, gradients and out= on
# the GPU, the stream tests), in parallel where pytest-xdist is installed; the
# CPU kernels are built as DEFAULT only (the CPU builds are tested by the
# main suite on CPU machines), which halves the build. Warnings are not
# errors here: the GPU machine's compiler may not be CI's (GCC 13 warns in
# torch 2.11's own autograd headers).
#
# Environment: PYTHON (default python3), CUDA_HOME (default: the toolkit of
# the nvcc on PATH, else /usr/local/cuda), TORCH_CUDA_ARCH_LIST (default: the
# GPU's compute capability), FUSEOPS_BUILD_DIR (default build/gpu; the
# virtualenv is build/gpu-venv), FUSEOPS_GPU_CHECK_SECONDS (default 540: the
# steps share this time, each also within its own limit, so a slow step cannot
# starve the ones after it of all their time), FUSEOPS_CPU_CAPABILITIES
# (default DEFAULT), FUSEOPS_GPU_PYTEST_SELECT (pytest's -k, default
# "cuda and not test_build"), FUSEOPS_GPU_BENCH_PRESET (default quick),
# FUSEOPS_GTEST_SOURCE_DIR (GoogleTest's sources, when the system has none).
# Without internet, pip takes missing build and test packages from a folder
# of wheels: PIP_NO_INDEX=1 PIP_FIND_LINKS=/path/to/wheels, or gpu-wheels/ at
# the repository's root when it is there (tools/gpu_wheels.sh fills it on a
# machine with internet).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

out=${OUT:-gpu-results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
python=${PYTHON:-python3}
build_dir=${FUSEOPS_BUILD_DIR:-build/gpu}
venv=$build_dir-venv
deadline=$(($(date +%s) + ${FUSEOPS_GPU_CHECK_SECONDS:-540}))
jobs=$(nproc)
summary=$out/summary.txt
: >"$summary"
failed=0

note() { echo "== $*" | tee -a "$summary"; }
die() {
  echo "gpu_check: $*" | tee -a "$summary" >&2
  exit 1
}

# Runs one step within its limit and the time left, its output in
# $out/NAME.log; a failure is recorded and the later steps still run.
step() {
  local name=$1 limit=$2
  shift 2
  local start rc
  start=$(date +%s)
  if [ $((deadline - start)) -lt "$limit" ]; then
    limit=$((deadline - start))
  fi
  if [ "$limit" -lt 10 ]; then
    printf '%-8s %s\n' "$name" "FAILED (not run: out of time)" | tee -a "$summary"
    failed=1
    return 1
  fi
  echo "== $name (log: $out/$name.log)"
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  local result="ok"
  if [ "$rc" -eq 124 ]; then
    result="FAILED (over its ${limit} s limit)"
  elif [ "$rc" -ne 0 ]; then
    result="FAILED (exit $rc)"
  fi
  [ "$rc" -eq 0 ] || failed=1
  printf '%-8s %-40s %4d s\n' "$name" "$result" "$(($(date +%s) - start))" | tee -a "$summary"
  tail -n 3 "$out/$name.log"
  return "$rc"
}

# --- the toolkit, the GPU and the torch that will run fuseops ----------------
if [ -n "${CUDA_HOME:-}" ]; then
  [ -x "$CUDA_HOME/bin/nvcc" ] || die "CUDA_HOME=$CUDA_HOME has no bin/nvcc"
  cuda_home=$CUDA_HOME
elif nvcc_path=$(command -v nvcc); then
  cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc_path")")")
  # A wrapper script named nvcc (e.g. /usr/local/bin/nvcc) is no toolkit.
  [ -f "$cuda_home/include/cuda_runtime.h" ] || cuda_home=/usr/local/cuda
else
  cuda_home=/usr/local/cuda
fi
[ -x "$cuda_home/bin/nvcc" ] ||
  die "no CUDA toolkit: no nvcc in CUDA_HOME, on PATH or in /usr/local/cuda (set CUDA_HOME)"
# The toolkit's own nvcc first: a wrapper elsewhere on PATH confuses torch's
# CUDA lookup.
export PATH="$cuda_home/bin:$PATH"
export CUDACXX="$cuda_home/bin/nvcc"

command -v "$python" >/dev/null || die "no $python (set PYTHON)"
"$python" - <<'PY' 2>&1 | tee -a "$summary" || die "this torch cannot run fuseops on a GPU (above)"
import sys
import torch
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), Python {sys.version.split()[0]}")
if torch.version.cuda is None:
    sys.exit("torch is a CPU-only build: install a CUDA build of torch first")
if not torch.cuda.is_available():
    sys.exit("torch sees no GPU (driver missing, or no device visible)")
for i in range(torch.cuda.device_count()):
    print(f"GPU {i}: {torch.cuda.get_device_name(i)}, compute capability "
          + ".".join(map(str, torch.cuda.get_device_capability(i))))
PY
"$cuda_home/bin/nvcc" --version | tail -n 1 | tee -a "$summary"

if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
  TORCH_CUDA_ARCH_LIST=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
    sort -u | paste -sd ' ' -)
  [ -n "$TORCH_CUDA_ARCH_LIST" ] || TORCH_CUDA_ARCH_LIST=$("$python" -c \
    "import torch; print('%d.%d' % torch.cuda.get_device_capability())" 2>/dev/null)
  TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
fi
export TORCH_CUDA_ARCH_LIST
note "CUDA $cuda_home, architectures $TORCH_CUDA_ARCH_LIST, $jobs jobs"

# A C++ compiler whose libstdc++ is shared, as torch's is: one that links it
# statically gives libfuseops.so a second C++ runtime, and every error
# message then crashes (cmake/FuseopsCompiler.cmake). CXX first, then the
# usual names and the distribution's g++.
shared_runtime() {
  local file
  file=$("$1" -print-file-name=libstdc++.so 2>/dev/null) && [[ $file == /* ]]
}
chosen=""
for candidate in ${CXX:-} c++ g++ /usr/bin/g++ /usr/bin/g++-14 /usr/bin/g++-13 /usr/bin/g++-12; do
  if command -v "$candidate" >/dev/null && shared_runtime "$candidate"; then
    chosen=$(command -v "$candidate")
    break
  fi
done
if [ -n "$chosen" ]; then
  # nvcc's host compiler too: CMake adds its library folders to the link of
  # libfuseops.so, and a CUDAHOSTCXX whose folders hold only libstdc++.a
  # links the static runtime in even with a good CXX.
  export CXX=$chosen CUDAHOSTCXX=$chosen
  note "C++ and CUDA host compiler $CXX ($("$CXX" -dumpfullversion 2>/dev/null)), libstdc++ $("$CXX" -print-file-name=libstdc++.so)"
else
  note "WARNING: no C++ compiler with a shared libstdc++ found: error messages may crash"
fi
nvidia-smi >"$out/nvidia-smi.txt" 2>&1

# --- build and test packages -------------------------------------------------
if "$python" -c "import sys; sys.exit(sys.prefix == sys.base_prefix)"; then
  # Already a virtualenv (whose --system-site-packages would be its base's).
  py=$("$python" -c "import sys; print(sys.executable)")
else
  if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv --system-site-packages "$venv" ||
      die "could not create $venv (Debian: apt-get install python3-venv)"
  fi
  py=$PWD/$venv/bin/python
  "$py" -c "import torch" || die "$venv does not see the torch of $python"
fi
# CMake must find this python, the one whose torch fuseops is built against.
PATH="$(dirname "$py"):$PATH"
export PATH

# Two lines: what the build and the tests need, then what they can do
# without (scikit-build-core falls back to make without ninja; the bench and
# demo tests check their PNGs, which need matplotlib, and fail saying so).
wanted=$("$py" - <<'PY'
import importlib.util, re, shutil, subprocess

def tool_version(name):
    path = shutil.which(name)
    if path is None:
        return None
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"(\d+)\.(\d+)", out)
    return tuple(map(int, match.groups())) if match else None

def missing(modules):
    return " ".join(requirement for module, requirement in modules
                    if importlib.util.find_spec(module) is None)

needed = missing([("pytest", "pytest>=8"), ("numpy", "numpy"), ("expecttest", "expecttest")])
# pyproject.toml's [[tool.dynamic-metadata]] (the wheel's torch pin) needs 1.1.
try:
    import importlib.metadata as metadata
    skbuild = tuple(int(p) for p in metadata.version("scikit-build-core").split(".")[:2])
except Exception:
    skbuild = (0, 0)
if skbuild < (1, 1):
    needed += " scikit-build-core>=1.1"
if (tool_version("cmake") or (0, 0)) < (3, 26):
    needed += " cmake>=3.26"
optional = missing([("matplotlib", "matplotlib"), ("tqdm", "tqdm")])
if tool_version("ninja") is None:
    optional += " ninja"
print(needed.strip())
print(optional.strip())
PY
) || die "could not inspect the packages of $py"
needed=$(sed -n 1p <<<"$wanted")
if [ -z "${PIP_FIND_LINKS:-}" ] && [ -d gpu-wheels ]; then
  export PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/gpu-wheels
  note "pip installs from gpu-wheels/ only"
fi
optional=$(sed -n 2p <<<"$wanted")
: >"$out/pip.log"
if [ -n "$needed" ]; then
  note "installing $needed"
  # shellcheck disable=SC2086 # one word per requirement
  "$py" -m pip install -q $needed >>"$out/pip.log" 2>&1 ||
    die "pip could not install $needed (no internet? see $out/pip.log; offline, bring the folder that tools/gpu_wheels.sh fills)"
fi
if [ -n "$optional" ]; then
  # shellcheck disable=SC2086 # one word per requirement
  "$py" -m pip install -q $optional >>"$out/pip.log" 2>&1 ||
    note "could not install $optional: going on without (see $out/pip.log)"
fi

# GoogleTest from the system (there is no download without internet): its
# CMake package, or its sources.
cpp_tests=ON
gtest_args=()
gtest_config=$(find /usr/lib /usr/lib64 /usr/local/lib -maxdepth 4 -name GTestConfig.cmake \
  -print -quit 2>/dev/null)
gtest_sources=${FUSEOPS_GTEST_SOURCE_DIR:-/usr/src/googletest}
if [ -z "${FUSEOPS_GTEST_SOURCE_DIR:-}" ] && [ ! -f "$gtest_sources/CMakeLists.txt" ] &&
  [ -f gpu-wheels/googletest/CMakeLists.txt ]; then
  gtest_sources=gpu-wheels/googletest  # brought by tools/gpu_wheels.sh
fi
if [ -n "${FUSEOPS_GTEST_SOURCE_DIR:-}" ] || [ -z "$gtest_config" ]; then
  if [ -f "$gtest_sources/CMakeLists.txt" ]; then
    gtest_args=(-C cmake.define.FETCHCONTENT_SOURCE_DIR_GOOGLETEST="$(cd "$gtest_sources" && pwd)")
  else
    cpp_tests=OFF
    note "ctest SKIPPED: no GoogleTest on this machine (apt-get install libgtest-dev)"
  fi
fi

# --- build, test, benchmark ---------------------------------------------------
export CMAKE_BUILD_PARALLEL_LEVEL=$jobs
export CCACHE_BASEDIR=$PWD
step build 420 "$py" -m pip install -v --no-build-isolation --no-deps \
  -C build-dir="$build_dir" -C cmake.define.FUSEOPS_CUDA=ON \
  -C cmake.define.FUSEOPS_BUILD_TESTS="$cpp_tests" -C cmake.define.FUSEOPS_WERROR=OFF \
  -C cmake.define.FUSEOPS_CPU_CAPABILITIES="${FUSEOPS_CPU_CAPABILITIES:-DEFAULT}" \
  "${gtest_args[@]}" . ||
  die "the build failed: nothing to test (see $out/build.log)"
step info 60 "$py" -m fuseops info
readelf -dW "$("$py" -c 'import fuseops; print(fuseops.library_path)')" >"$out/readelf.txt" 2>&1
grep -q 'NEEDED.*\[libstdc++\.so\.6\]' "$out/readelf.txt" ||
  die "libfuseops.so does not need the shared libstdc++.so.6 (see $out/readelf.txt): a static C++ runtime beside torch's crashes on every error message; build with CXX and CUDAHOSTCXX set to a compiler with a shared libstdc++"
"$py" -c "import fuseops, sys; sys.exit(not fuseops.build_info()['cuda'])" ||
  die "fuseops was built without its CUDA kernels (see $out/build.log)"

if [ "$cpp_tests" = ON ]; then
  step ctest 180 ctest --test-dir "$build_dir" --output-on-failure -j"$jobs"
fi
# The gdb printers do not depend on how the library was built; the CPU run
# tests them, as in tools/cuda_compile_check.sh.
parallel=()
if "$py" -c "import xdist" 2>/dev/null; then
  parallel=(-n "$((jobs < 8 ? jobs : 8))")
fi
step pytest 300 "$py" -m pytest tests_py -v -ra --durations=15 --ignore=tests_py/test_gdb.py \
  -k "${FUSEOPS_GPU_PYTEST_SELECT:-cuda and not test_build}" "${parallel[@]}" -p no:benchmark \
  --junitxml="$out/pytest.xml"
step bench 300 "$py" -m fuseops bench --device cuda --preset "${FUSEOPS_GPU_BENCH_PRESET:-quick}" \
  --out "$out/bench" --no-progress

if [ "$failed" -ne 0 ]; then
  note "FAILED: see the logs in $out"
  exit 1
fi
note "all steps passed; results in $out"
