#!/usr/bin/env bash
# Sets up (tools/setup.sh) and runs the main job: how fuseops was built, then
# a relu forward/backward demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
venv=${FUSEOPS_VENV:-.venv}
"$venv/bin/python" -m fuseops info
"$venv/bin/python" -m fuseops demo
