#!/usr/bin/env bash
# Static checks, run by .ci/run before anything is built (seconds, not
# minutes): ruff's formatter and linter over the Python sources,
# clang-format over the C++ and CUDA sources (.clang-format), the
# generated export lists, and mypy over the fuseops package. The tools live
# in their own small virtualenv (.venv-lint), pinned, so that every machine
# formats alike; torch is not installed there, so mypy treats it as untyped
# (it checks fuseops' own code, not torch's stubs, which take minutes).
#
#   bash tools/lint.sh          # check; exits non-zero on any finding
#   bash tools/lint.sh --fix    # reformat and apply ruff's safe fixes first
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${FUSEOPS_LINT_VENV:-.venv-lint}
ruff_version=0.17.6
mypy_version=2.4.1
clang_format_version=23.1.5
if ! "$venv/bin/ruff" --version 2>/dev/null | grep -q "$ruff_version" ||
   ! "$venv/bin/mypy" --version 2>/dev/null | grep -q "$mypy_version" ||
   ! "$venv/bin/clang-format" --version 2>/dev/null | grep -q "$clang_format_version"; then
  echo "== installing ruff $ruff_version, mypy $mypy_version and clang-format" \
    "$clang_format_version into $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q "ruff==$ruff_version" "mypy==$mypy_version" \
    "clang-format==$clang_format_version"
fi

paths=(python tests_py tools)
# Every C++ and CUDA source the project owns (git ls-files: build trees and
# virtualenvs are not in it).
mapfile -t cxx_sources < <(git ls-files -- 'cpp' 'cuda' 'tests_cpp' 'tools' 'python' |
  grep -E '\.(h|hpp|cpp|cu|cuh)$')
if [ "${1:-}" = "--fix" ]; then
  "$venv/bin/ruff" format "${paths[@]}"
  "$venv/bin/ruff" check --fix "${paths[@]}"
  "$venv/bin/clang-format" -i "${cxx_sources[@]}"
fi
echo "== ruff format --check"
"$venv/bin/ruff" format --check "${paths[@]}"
echo "== ruff check"
"$venv/bin/ruff" check "${paths[@]}"
echo "== clang-format --dry-run (${#cxx_sources[@]} files)"
"$venv/bin/clang-format" --dry-run -Werror "${cxx_sources[@]}"
echo "== generated exports"
python3 tools/generate_exports.py --check
echo "== mypy python/fuseops"
"$venv/bin/mypy" python/fuseops
