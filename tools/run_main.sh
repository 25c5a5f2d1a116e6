#!/usr/bin/env bash
# Sets up (tools/setup.sh, which also installs the bench extra: matplotlib and
# tqdm) and runs the main job: how fuseops was built, the quick benchmark
# against eager PyTorch, torch.compile and the native ops (table, JSON, CSV and
# chart in bench-results/), then the training demo twice: the small model
# (demo-results/) and the large preset (hidden 1024, 512 positions:
# demo-results/large/), each under the process's default memory settings and
# again, in a child process, under fuseops.cpu.tune_memory().
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
echo "== python -m fuseops demo --compare-tune-memory"
"$venv/bin/python" -m fuseops demo --compare-tune-memory --out demo-results
echo "== python -m fuseops demo --preset large --compare-tune-memory"
"$venv/bin/python" -m fuseops demo --preset large --compare-tune-memory --out demo-results/large
echo "== results: bench-results/bench.txt (table), bench-results/speedup.png (chart),"
echo "   bench-results/bench.json and .csv; demo-results/demo.json and demo-loss.png"
echo "   (tuned/: the child process under fuseops.cpu.tune_memory()), the same for the"
echo "   large preset in demo-results/large/"
