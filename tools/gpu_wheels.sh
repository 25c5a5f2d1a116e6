#!/usr/bin/env bash
# Downloads the pure-Python wheels that tools/gpu_check.sh installs when the
# GPU machine's Python lacks them (today: expecttest, which the op checks
# import), into gpu-wheels/ at the repository's root, and copies GoogleTest's
# sources there (from /usr/src/googletest, Debian's libgtest-dev). Run it on a machine
# with internet and bring gpu-wheels/ along to a GPU machine without one:
# gpu_check.sh installs from that folder, with no index, when it is there.
# Usage: tools/gpu_wheels.sh [PYTHON] (default python3; any Python with pip).
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
python=${1:-python3}
mkdir -p gpu-wheels
# py3-none-any wheels only: they install on the GPU machine's Python,
# whatever its version.
"$python" -m pip download -q --no-deps --only-binary=:all: -d gpu-wheels expecttest
# GoogleTest's sources, for the ctest step where the GPU machine has no
# GoogleTest of its own (no download there either).
if [ -f /usr/src/googletest/CMakeLists.txt ] && [ ! -d gpu-wheels/googletest ]; then
  cp -r /usr/src/googletest gpu-wheels/googletest
fi
ls gpu-wheels
