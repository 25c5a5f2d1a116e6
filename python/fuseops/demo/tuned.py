"""``--compare-tune-memory``: the same runs again in a child process under
``fuseops.cpu.tune_memory()`` (a process-wide setting), added to the
summary."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .runner import DemoSettings


def _child_arguments(settings: DemoSettings, args: argparse.Namespace, out: str) -> list[str]:
    """Command-line arguments that rerun `settings` in another process."""
    argv = [
        "--steps",
        settings.steps,
        "--d-model",
        settings.d_model,
        "--layers",
        settings.n_layers,
        "--heads",
        settings.n_heads,
        "--seq-len",
        settings.seq_len,
        "--batch-size",
        settings.batch_size,
        "--lr",
        settings.lr,
        "--dtype",
        settings.dtype,
        "--seed",
        settings.seed,
        "--out",
        out,
        "--no-plot",
        "--no-progress",
        # The quantized evaluation concerns the trained model, not the
        # memory settings: the parent's run reports it.
        "--quantized-eval-batches",
        0,
    ]
    if args.threads is not None:
        argv += ["--threads", args.threads]
    if settings.compile:
        argv.append("--compile")
    return [str(a) for a in argv]


def run_tuned_child(settings: DemoSettings, args: argparse.Namespace, out: str) -> dict:
    """Trains the same models in a child process under tune_memory(); returns
    its summary. The child's own report goes to stderr, as progress."""
    import subprocess

    command = [
        sys.executable,
        "-m",
        "fuseops",
        "demo",
        "--tune-memory",
        *_child_arguments(settings, args, out),
    ]
    print(
        "== the same runs under fuseops.cpu.tune_memory(), in a child process",
        file=sys.stderr,
        flush=True,
    )
    result = subprocess.run(command, stdout=sys.stderr)
    if result.returncode != 0:
        raise RuntimeError(
            f"fuseops demo: the --tune-memory child failed "
            f"(exit {result.returncode}): {' '.join(command)}"
        )
    with open(os.path.join(out, "demo.json")) as f:
        return json.load(f)


def add_tuned_runs(summary: dict, tuned: dict) -> None:
    """Adds the child's runs as "<name> + tune_memory", their speed relative
    to the default-settings torch.nn run (timed in another process: ratios
    across the two carry the machine's drift between them)."""
    base = summary["runs"]["torch.nn"]["steps_per_second"]
    summary["memory_settings_tuned"] = tuned["memory_settings"]
    for name, run in tuned["runs"].items():
        speed = run["steps_per_second"]
        summary["runs"][f"{name} + tune_memory"] = {
            **run,
            "speedup_vs_torch_nn": speed / base if speed and base else None,
            "other_process": True,
        }
