#!/usr/bin/env bash
# The release lane: the whole pytest suite once per fuseops CPU build this
# CPU can execute (DEFAULT, AVX2, AVX512), each forced with
# ATEN_CPU_CAPABILITY, so that a deviation of one build in a full op case
# shows on any machine, not only on a CPU whose best build it is. The
# regular suite (tools/run_tests.sh, CI) runs the best build in full and
# the others only in the per-build subset of test_conformance.py; this lane
# takes about three times as long and runs before a release.
#
#   bash tools/run_tests_every_build.sh            # every runnable build
#   bash tools/run_tests_every_build.sh AVX2 -x    # one build, pytest args
#
# Exits non-zero if any build's run fails; prints one line per build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh

venv=${FUSEOPS_VENV:-.venv}
build_dir=${FUSEOPS_BUILD_DIR:-build/wheel}
export PATH="$PWD/$venv/bin:$PATH"
export FUSEOPS_GDB_FIXTURE_DIR="$PWD/$build_dir/tests_cpp/gdb"

runnable=$(python -c "import fuseops; print(' '.join(fuseops.build_info()['runnable_cpu_capabilities']))")
builds=$runnable
if [[ $# -gt 0 && $1 =~ ^(DEFAULT|AVX2|AVX512)$ ]]; then
  builds=$1
  shift
  if [[ " $runnable " != *" $builds "* ]]; then
    echo "this CPU runs only $runnable; it cannot execute the $builds build" >&2
    exit 2
  fi
fi

summary=()
status=0
for build in $builds; do
  echo "== pytest under ATEN_CPU_CAPABILITY=${build,,}"
  # Proof that the build was the one selected, before spending the run on it.
  selected=$(ATEN_CPU_CAPABILITY=${build,,} python -c \
    "import fuseops; print(fuseops.build_info()['selected_cpu_capability'])")
  if [[ $selected != "$build" ]]; then
    echo "forcing $build selected $selected" >&2
    exit 1
  fi
  if ATEN_CPU_CAPABILITY=${build,,} python -m pytest tests_py -n "${FUSEOPS_TEST_WORKERS:-2}" \
    --dist loadfile -q "$@"; then
    summary+=("$build: passed")
  else
    summary+=("$build: FAILED")
    status=1
  fi
done
printf '== %s\n' "${summary[@]}"
exit $status
