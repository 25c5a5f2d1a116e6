#!/usr/bin/env bash
# Sets up (tools/setup.sh) and runs every test: GoogleTest and the
# find_package consumer project under ctest, then pytest. Exits non-zero if
# any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh

venv=${FUSEOPS_VENV:-.venv}
build_dir=${FUSEOPS_BUILD_DIR:-build/wheel}
export PATH="$PWD/$venv/bin:$PATH"

echo "== ctest ($build_dir)"
ctest --test-dir "$build_dir" --output-on-failure -j2

echo "== pytest"
# The gdb printer tests build their fixture programs in this CMake build.
export FUSEOPS_GDB_FIXTURE_DIR="$PWD/$build_dir/tests_cpp/gdb"
# --durations: where the suite's time goes, for keeping CI within its budget.
# Two workers (pytest-xdist), a test file to each at a time: the files that
# set threads or environment variables keep them to their own process, and
# the per-build check of conftest.py merges what the workers ran.
# FUSEOPS_TEST_WORKERS=0 runs in this process.
python -m pytest tests_py -n "${FUSEOPS_TEST_WORKERS:-2}" --dist loadfile --durations=25 "$@"
