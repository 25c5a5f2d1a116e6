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
python -m pytest tests_py --durations=25 "$@"
