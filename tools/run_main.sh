#!/usr/bin/env bash
# Sets up (tools/setup.sh, which also installs the bench extra: matplotlib and
# tqdm) and runs the main job: how fuseops was built, the quick benchmark
# against eager PyTorch, torch.compile and the native ops (table, JSON, CSV and
# chart in bench-results/), then the training demo (summary and loss curves in
# demo-results/), under the process's default memory settings and again under
# fuseops.cpu.tune_memory() (demo-results/tuned/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
venv=${FUSEOPS_VENV:-.venv}
"$venv/bin/python" -m fuseops info
# OpenMP threads that spin while waiting for a core busy with another process
# distort timings on a small shared machine (measured on 2 cores: a 16 MiB
# copy_ at 2.1 GB/s spinning, 10.9 GB/s passive); fuseops and its peers all run
# under the same policy.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
echo "== python -m fuseops bench (quick preset)"
"$venv/bin/python" -m fuseops bench --out bench-results
echo "== python -m fuseops demo"
"$venv/bin/python" -m fuseops demo --out demo-results
# Once more with freed memory kept for reuse (fuseops.cpu.tune_memory(), which
# changes the whole process, so a second process): what the setting itself
# is worth, for both models.
echo "== python -m fuseops demo --tune-memory"
"$venv/bin/python" -m fuseops demo --tune-memory --out demo-results/tuned
echo "== results: bench-results/bench.txt (table), bench-results/speedup.png (chart),"
echo "   bench-results/bench.json and .csv; demo-results/demo.json and demo-loss.png,"
echo "   demo-results/tuned/ (the same under fuseops.cpu.tune_memory())"
