#!/usr/bin/env bash
# Sets up (tools/setup.sh, which also installs the bench extra: matplotlib and
# tqdm) and runs the main job: how fuseops was built, the quick benchmark
# against eager PyTorch, torch.compile and the native ops (one case per op
# family and dtype: table, JSON, CSV and chart in bench-results/), then the
# training demo of the small model once, 80 steps (demo-results/). It ends with the
# commands of the longer runs, which it leaves out to stay short.
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
echo "== python -m fuseops demo --steps 80"
"$venv/bin/python" -m fuseops demo --steps 80 --out demo-results
cat <<'DONE'
== results: bench-results/bench.txt (table), bench-results/speedup.png (chart),
   bench-results/bench.json and .csv; demo-results/demo.json and demo-loss.png
== longer runs (python from .venv/bin, OMP_WAIT_POLICY=PASSIVE as above):
   python -m fuseops bench --preset standard --out bench-results/standard
       every op but the variants, forward, forward+backward and out=
   python -m fuseops bench --full --out bench-results/full
       the speed targets' shapes, variants included (tens of minutes on 2 cores)
   python -m fuseops demo --compare-tune-memory --out demo-results
       the small model for its default 150 steps, then again under
       fuseops.cpu.tune_memory() in a child process
   python -m fuseops demo --preset large --compare-tune-memory --out demo-results/large
       hidden 1024, 512 positions, 38 M parameters, bfloat16
DONE
