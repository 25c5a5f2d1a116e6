"""``python -m fuseops bench``: fuseops against its peers, measured side by side.

For each op, dtype, shape and mode (forward, forward+backward, forward with
``out=``, and on request forward+backward with a fresh upstream gradient,
which a backward may write its result over) the result is first checked
against a high-precision reference on the very inputs that are timed, then
fuseops, the eager reference, ``torch.compile`` of the reference, PyTorch's
native op and a copy of the same bytes are timed in one run. The modules: ``cases``, the registry of ops;
``runner``, the loop over cases, dtypes, shapes and modes; ``calls``, how each
mode calls an op and its peers; ``correctness``, the check against the
reference; ``timing``, how time and memory are measured; ``environment``, the
machine and method recorded with the results; ``results`` and ``report``, the
rows and their table, JSON, CSV and chart; ``hf_models``, the
``--transformers`` run (a Hugging Face model with and without fuseops).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Optional

import torch

from . import cases, correctness, environment, hf_models, report, results, runner, timing

SHAPE_PRESETS = {
    # Each tensor 4-8 MiB; the op rotates through enough input sets that the
    # cache does not hold them. Every op, both default dtypes and all modes
    # take a few minutes on 2 cores, most of it torch.compile compiling the
    # reference (a second run finds its compilations cached).
    "quick": [(1024, 2048)],
    # The shapes of the project's speed targets: 64 MiB float32 tensors, whose
    # allocation page-faults afresh on every call, and many short rows.
    "full": [(4096, 4096), (16384, 1024)],
}
FULL_MIN_TIME = 0.2
MODE_ALIASES = {
    "forward": "forward", "fwd": "forward",
    "forward+backward": "forward+backward", "fwd+bwd": "forward+backward",
    "backward": "forward+backward",
    "out": "out", "fwd-out": "out",
    results.FRESH_GRAD: results.FRESH_GRAD, "fresh-grad": results.FRESH_GRAD,
    "fwd+bwd-fresh": results.FRESH_GRAD, "train": results.FRESH_GRAD,
}
MODES_HELP = ("forward, forward+backward, out, fresh-grad (forward+backward with a fresh "
              "upstream gradient handed over as in training; alias train)")


def _split(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_dtypes(text: str) -> list[torch.dtype]:
    dtypes = []
    for name in _split(text):
        dtype = getattr(torch, name, None)
        if dtype not in correctness.TOLERANCES:
            raise argparse.ArgumentTypeError(
                f"unsupported dtype {name!r}: use float32, bfloat16, float16 or float64")
        dtypes.append(dtype)
    return dtypes


def parse_shapes(text: str) -> list[tuple[int, int]]:
    if text in SHAPE_PRESETS:
        return SHAPE_PRESETS[text]
    shapes = []
    for item in _split(text):
        try:
            rows, hidden = (int(part) for part in item.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad shape {item!r}: use ROWSxHIDDEN, e.g. 4096x4096, or a preset "
                f"({', '.join(SHAPE_PRESETS)})") from None
        shapes.append((rows, hidden))
    return shapes


def _preset_of(shapes) -> Optional[str]:
    """The preset `--shapes` named (parse_shapes returns the preset's own
    list), or None for explicit shapes."""
    if isinstance(shapes, str):
        return shapes if shapes in SHAPE_PRESETS else None
    return next((name for name, preset in SHAPE_PRESETS.items() if shapes is preset), None)


def parse_modes(text: str) -> list[str]:
    modes = []
    for name in _split(text):
        if name not in MODE_ALIASES:
            raise argparse.ArgumentTypeError(
                f"unknown mode {name!r}: use {MODES_HELP}")
        modes.append(MODE_ALIASES[name])
    return [mode for mode in results.MODES if mode in modes]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ops", type=_split, default=None,
                        help="comma-separated ops (default: every op; --full adds the "
                             "variants). Registered: " + ", ".join(
                                 c.name + (" (variant)" if c.variant else "")
                                 for c in cases.CASES))
    parser.add_argument("--dtype", type=parse_dtypes, default="float32,bfloat16",
                        help="comma-separated dtypes (default float32,bfloat16)")
    parser.add_argument("--shapes", type=parse_shapes, default="quick",
                        help="'quick' (default: "
                             f"{', '.join('x'.join(map(str, s)) for s in SHAPE_PRESETS['quick'])})"
                             ", 'full', or ROWSxHIDDEN,... (the op works over HIDDEN)")
    parser.add_argument("--full", action="store_true",
                        help="the full sweep: --shapes full ("
                             f"{', '.join('x'.join(map(str, s)) for s in SHAPE_PRESETS['full'])})"
                             ", variants included; tens of minutes on 2 cores")
    parser.add_argument("--modes", type=parse_modes, default=",".join(results.DEFAULT_MODES),
                        help=f"comma-separated: {MODES_HELP} (default: "
                             f"{', '.join(results.DEFAULT_MODES)})")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's default, "
                             f"{torch.get_num_threads()} here)")
    parser.add_argument("--tune-memory", action="store_true",
                        help="apply fuseops.cpu.tune_memory() first (freed memory kept for "
                             "reuse, process-wide: every peer runs under it too)")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip the torch.compile(reference) peer (its compilation "
                             "takes seconds per op and shape)")
    parser.add_argument("--min-time", type=float, default=None,
                        help="seconds of timed calls per implementation and row, at least "
                             f"(default {timing.TimerSettings().min_time}, "
                             f"{FULL_MIN_TIME} with --full); at least "
                             f"{timing.TimerSettings().min_blocks} samples are taken anyway")
    parser.add_argument("--out", default="bench-results",
                        help="output folder (default bench-results)")
    parser.add_argument("--json", default=None,
                        help="JSON results file (default OUT/bench.json)")
    parser.add_argument("--csv", default=None, help="CSV results file (default OUT/bench.csv)")
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG chart")
    parser.add_argument("--profile", action="store_true",
                        help="also write a torch.profiler Chrome trace and a memory table per "
                             "row into OUT/profile/")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    hf_models.add_arguments(parser)


def _progress_bar(total: int, enabled: bool) -> tuple[Callable[[str], None], Callable[[], None]]:
    """(advance(description), close()) — tqdm when installed, else one line per step."""
    if not enabled:
        return (lambda description: None), (lambda: None)
    try:
        from tqdm import tqdm
    except ImportError:
        state = {"done": 0}

        def advance(description: str) -> None:
            state["done"] += 1
            print(f"[{state['done']}/{total}] {description}", file=sys.stderr, flush=True)

        return advance, (lambda: None)
    bar = tqdm(total=total, unit="row", file=sys.stderr, dynamic_ncols=True)
    state = {"started": False}

    def advance(description: str) -> None:
        if state["started"]:
            bar.update(1)
        state["started"] = True
        bar.set_description(description)

    def close() -> None:
        if state["started"]:
            bar.update(1)
        bar.close()

    return advance, close


def _apply_memory_settings(args: argparse.Namespace) -> Optional[dict]:
    """fuseops.cpu.tune_memory()'s settings when --tune-memory asks for them
    (None: the process's defaults)."""
    if not getattr(args, "tune_memory", False):
        return None
    import fuseops

    return fuseops.cpu.tune_memory()


def run(args: argparse.Namespace, case_list: Optional[list] = None) -> int:
    """Runs the benchmark for parsed `args` (tests pass their own cases)."""
    if getattr(args, "transformers", None):
        return hf_models.run(args)
    device = torch.device(args.device)
    problem = environment.check_device(device)
    if problem:
        print(f"fuseops bench: {problem}", file=sys.stderr)
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    memory_settings = _apply_memory_settings(args)
    try:
        selected = case_list if case_list is not None else cases.by_name(
            args.ops, variants=args.full)
    except ValueError as error:
        print(f"fuseops bench: {error}", file=sys.stderr)
        return 2
    dtypes = parse_dtypes(args.dtype) if isinstance(args.dtype, str) else args.dtype
    shapes = SHAPE_PRESETS["full"] if args.full else (
        parse_shapes(args.shapes) if isinstance(args.shapes, str) else args.shapes)
    modes = parse_modes(args.modes) if isinstance(args.modes, str) else args.modes
    os.makedirs(args.out, exist_ok=True)
    config = runner.Config(
        cases=selected, dtypes=dtypes, shapes=shapes, modes=modes, device=device,
        compile_peer=not args.no_compile,
        timer=timing.TimerSettings(min_time=args.min_time if args.min_time is not None else (
            FULL_MIN_TIME if args.full else timing.TimerSettings().min_time)),
        profile_dir=os.path.join(args.out, "profile") if args.profile else None,
        preset="full" if args.full else _preset_of(args.shapes),
    )
    env = environment.environment(config)
    env["memory_settings"] = memory_settings
    bench = runner.Runner(config)
    advance, close = _progress_bar(bench.row_count(), not args.no_progress)
    bench.progress = advance
    try:
        rows = list(bench.run())
    finally:
        close()

    text = report.table(rows, env)
    print(text)
    json_path = args.json or os.path.join(args.out, "bench.json")
    csv_path = args.csv or os.path.join(args.out, "bench.csv")
    table_path = os.path.join(args.out, "bench.txt")
    with open(table_path, "w") as f:
        f.write(text + "\n")
    report.write_json(json_path, rows, env)
    report.write_csv(csv_path, rows, env)
    written = [f"table {table_path}", f"JSON {json_path}", f"CSV {csv_path}"]
    if not args.no_plot:
        chart_path = os.path.join(args.out, "speedup.png")
        if report.write_chart(chart_path, rows, env):
            written.append(f"chart {chart_path}")
        else:
            written.append("no chart: matplotlib is not installed (pip install 'fuseops[bench]')")
    if config.profile_dir:
        written.append(f"profiler traces {config.profile_dir}/ (open in chrome://tracing "
                       "or Perfetto)")
    print("wrote " + "; ".join(written))
    return 1 if any(row.status in ("FAILED", "ERROR") for row in rows) else 0


__all__ = ["SHAPE_PRESETS", "add_arguments", "run"]
