#!/usr/bin/env bash
# Builds the library and the GoogleTest suite with AddressSanitizer and
# UndefinedBehaviorSanitizer (-DFUSEOPS_SANITIZE=address,undefined) in
# build/sanitize and runs the suite. Exits non-zero on a failing test or on
# any sanitizer report (each one ends the program).
#
# To stay within a few minutes on two cores, this build compiles the CPU
# kernels only as DEFAULT and as the build ATen picks on this CPU (the one
# every op runs here), at -O1, and builds only the gtest program. The full
# suite runs in one process: each gtest process would otherwise load torch
# under ASan again.
#
# LibTorch is not instrumented: ASan checks fuseops' own reads and writes,
# on every heap block of the process (its runtime replaces malloc), UBSan
# fuseops' own arithmetic, shifts, casts and bounds. tools/sanitize/lsan.supp
# holds the leak suppressions (none needed with torch 2.13.0), each with the
# evidence that the report is torch's.
#
# Needs tools/setup.sh's virtualenv (created if missing). Environment:
# FUSEOPS_VENV (default .venv), FUSEOPS_SANITIZE_BUILD_DIR (default
# build/sanitize), FUSEOPS_SANITIZE_JOBS (parallel compiles, default 2);
# arguments are passed to the gtest program (e.g. --gtest_filter=RmsNorm*).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${FUSEOPS_VENV:-.venv}
build_dir=${FUSEOPS_SANITIZE_BUILD_DIR:-build/sanitize}
if [ ! -x "$venv/bin/python" ] || [ ! -x "$venv/bin/cmake" ]; then
  bash tools/setup.sh
fi
export PATH="$PWD/$venv/bin:$PATH"
export CCACHE_BASEDIR="$PWD"
start=$(date +%s)

# ATen's pick on this CPU (honours ATEN_CPU_CAPABILITY): the build whose
# kernels every op runs here by default.
native=$(python -c "import torch; print(torch.backends.cpu.get_cpu_capability())")
case "$native" in
  AVX512) capabilities="DEFAULT;AVX512" ;;
  AVX2) capabilities="DEFAULT;AVX2" ;;
  *) capabilities="DEFAULT" ;;
esac

echo "== configuring $build_dir (address,undefined; CPU builds: $capabilities)"
# -O1 -g1: fast to compile, line numbers in reports. NDEBUG as in torch's own
# build, so that its headers' debug-only checks stay as torch compiled them.
# PRE_TEST discovery: the build does not run the program (ctest would).
cmake -S . -B "$build_dir" -G Ninja \
  -DPython_EXECUTABLE="$(command -v python)" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DFUSEOPS_SANITIZE=address,undefined \
  -DFUSEOPS_CPU_CAPABILITIES="$capabilities" \
  -DFUSEOPS_BUILD_TESTS=ON -DFUSEOPS_BUILD_PYTHON=OFF -DFUSEOPS_CUDA=OFF \
  -DFUSEOPS_GDB_TYPES=OFF \
  -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST >/dev/null

echo "== building fuseops_tests"
cmake --build "$build_dir" --target fuseops_tests -- -j"${FUSEOPS_SANITIZE_JOBS:-2}"
built=$(date +%s)

echo "== running the gtests under ASan + UBSan"
suppressions="$PWD/tools/sanitize"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=1:strict_init_order=1:check_initialization_order=1:detect_stack_use_after_return=1"
export LSAN_OPTIONS="suppressions=$suppressions/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
"$build_dir/tests_cpp/fuseops_tests" "$@"
echo "sanitize: built in $(( built - start )) s, tests ran in $(( $(date +%s) - built )) s"
