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
``--transformers`` run (a Hugging Face model with and without fuseops);
``decode``, the ``--decode`` run (``generate`` token by token, fuseops
patched and quantized against HF and torch.ao); ``llama_cpp_anchor``, its
llama.cpp rows (the same model as GGUF, decoded by llama.cpp);
``quality``, the ``--quality`` run (each quantize mode on real
pretrained models, ``real_models``: perplexity, KL divergence, the greedy
answer, bits per weight and decode speed side by side);
``programs``, the ``--executorch`` and ``--onnx`` runs (a patched model's
ExecuTorch and ONNX programs: size and time, float and quantized); ``markdown``, ``--markdown``
(an earlier run's JSON as GitHub Markdown tables, nothing run).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Optional

import torch

from . import (
    cases,
    decode,
    environment,
    hf_models,
    markdown,
    programs,
    quality,
    report,
    results,
    runner,
    timing,
)
from .correctness import parse_dtypes

SHAPE_PRESETS = {
    # Each tensor 4-8 MiB; the op rotates through enough input sets that the
    # cache does not hold them. The quick and standard presets differ only in
    # the cases' own shapes (Case.shapes: a linear layer's one row against
    # four).
    "quick": [(1024, 2048)],
    "standard": [(1024, 2048)],
    # The shapes of the project's speed targets: 64 MiB float32 tensors, whose
    # allocation page-faults afresh on every call, and many short rows.
    "full": [(4096, 4096), (16384, 1024)],
}
FULL_MIN_TIME = 0.2


@dataclass(frozen=True)
class Preset:
    """What a bare `python -m fuseops bench --preset NAME` runs; --ops,
    --modes, --shapes and --min-time each override their part."""

    help: str
    #: The cases: one per op family (its first that is not a variant), every
    #: op but the variants, or every op with its variants.
    cases: str
    #: Modes in order; with `first_mode_only` each case runs only the first
    #: of them it has (forward+backward, or forward for an inference op).
    modes: tuple
    first_mode_only: bool = False
    min_time: Optional[float] = None


PRESETS = {
    # A newcomer's first run: each op family once per dtype, in the mode
    # that matters most for it; the torch.compile peer's compilation is most
    # of the time.
    "quick": Preset(
        "one case per op family and dtype at 1024x2048 (linear layers: 32 tokens), "
        "forward+backward (forward for inference ops)",
        cases="per-family",
        modes=("forward+backward", "forward"),
        first_mode_only=True,
    ),
    "standard": Preset(
        "every op but the variants, forward, forward+backward and out= at 1024x2048 "
        "(linear layers: 1, 8, 32 and 256 tokens)",
        cases="no-variants",
        modes=results.DEFAULT_MODES,
    ),
    "full": Preset(
        "the shapes of the speed targets ("
        + ", ".join("x".join(map(str, s)) for s in SHAPE_PRESETS["full"])
        + f"), variants included, min time {FULL_MIN_TIME} s; tens of minutes on 2 cores",
        cases="all",
        modes=results.DEFAULT_MODES,
        min_time=FULL_MIN_TIME,
    ),
}
DEFAULT_PRESET = "quick"
#: The longer runs a preset's run points to when it ends.
LONGER_RUNS = {
    "quick": ("python -m fuseops bench --preset standard", "python -m fuseops bench --full"),
    "standard": ("python -m fuseops bench --full",),
}
MODE_ALIASES = {
    "forward": "forward",
    "fwd": "forward",
    "forward+backward": "forward+backward",
    "fwd+bwd": "forward+backward",
    "backward": "forward+backward",
    "out": "out",
    "fwd-out": "out",
    results.FRESH_GRAD: results.FRESH_GRAD,
    "fresh-grad": results.FRESH_GRAD,
    "fwd+bwd-fresh": results.FRESH_GRAD,
    "train": results.FRESH_GRAD,
}
MODES_HELP = (
    "forward, forward+backward, out, fresh-grad (forward+backward with a fresh "
    "upstream gradient handed over as in training; alias train)"
)


def _split(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


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
                f"({', '.join(SHAPE_PRESETS)})"
            ) from None
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
            raise argparse.ArgumentTypeError(f"unknown mode {name!r}: use {MODES_HELP}")
        modes.append(MODE_ALIASES[name])
    return [mode for mode in results.MODES if mode in modes]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset",
        choices=list(PRESETS),
        default=None,
        help="what to run: "
        + "; ".join(
            f"{name}{' (default)' if name == DEFAULT_PRESET else ''}: {p.help}"
            for name, p in PRESETS.items()
        )
        + ". --ops, --modes, --shapes and --min-time override their part",
    )
    parser.add_argument("--full", action="store_true", help="--preset full")
    parser.add_argument(
        "--ops",
        type=_split,
        default=None,
        help="comma-separated ops (default: the preset's). Registered: "
        + ", ".join(c.name + (" (variant)" if c.variant else "") for c in cases.CASES),
    )
    parser.add_argument(
        "--dtype",
        type=parse_dtypes,
        default="float32,bfloat16",
        help="comma-separated dtypes (default float32,bfloat16)",
    )
    parser.add_argument(
        "--shapes",
        type=parse_shapes,
        default=None,
        help="a shape preset ("
        + ", ".join(
            f"{name}: {', '.join('x'.join(map(str, s)) for s in shapes)}"
            for name, shapes in SHAPE_PRESETS.items()
        )
        + "; default: the preset's) or ROWSxHIDDEN,... (the op works over "
        "HIDDEN; explicit shapes apply to every op, linear layers too)",
    )
    parser.add_argument(
        "--modes",
        type=parse_modes,
        default=None,
        help=f"comma-separated: {MODES_HELP} (default: the preset's; every op "
        "runs each of them it has)",
    )
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help=f"torch threads (default: torch's default, {torch.get_num_threads()} here)",
    )
    parser.add_argument(
        "--tune-memory",
        action="store_true",
        help="apply fuseops.cpu.tune_memory() first (freed memory kept for "
        "reuse, process-wide: every peer runs under it too)",
    )
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="skip the torch.compile(reference) peer (its compilation "
        "takes seconds per op and shape)",
    )
    parser.add_argument(
        "--min-time",
        type=float,
        default=None,
        help="seconds of timed calls per implementation and row, at least "
        f"(default {timing.TimerSettings().min_time}, "
        f"{FULL_MIN_TIME} with --preset full); at least "
        f"{timing.TimerSettings().min_blocks} samples are taken anyway",
    )
    parser.add_argument(
        "--out", default="bench-results", help="output folder (default bench-results)"
    )
    parser.add_argument("--json", default=None, help="JSON results file (default OUT/bench.json)")
    parser.add_argument("--csv", default=None, help="CSV results file (default OUT/bench.csv)")
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG chart")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also write a torch.profiler Chrome trace and a memory table per "
        "row into OUT/profile/",
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress (default: a bar on a terminal, else one line per finished row on stderr)",
    )
    hf_models.add_arguments(parser)
    decode.add_arguments(parser)
    quality.add_arguments(parser)
    programs.add_arguments(parser)
    markdown.add_arguments(parser)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class Progress:
    """The rows' progress: a tqdm bar when the stream it draws on (stderr) is
    a terminal and tqdm is installed, else one plain line per finished row (a
    bar redraws itself with carriage returns, which a log keeps every frame of)."""

    def __init__(self, total: int, enabled: bool, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.done, self.enabled = total, 0, enabled
        self.bar = None
        if enabled and _is_terminal(self.stream):
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self.bar = tqdm(total=total, unit="row", file=self.stream, dynamic_ncols=True)

    def start(self, description: str) -> None:
        if self.bar is not None:
            self.bar.set_description(description)

    def finished(self, row: results.Row) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled:
            print(
                f"[{self.done}/{self.total}] {report.row_line(row)}", file=self.stream, flush=True
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _apply_memory_settings(args: argparse.Namespace) -> Optional[dict]:
    """fuseops.cpu.tune_memory()'s settings when --tune-memory asks for them
    (None: the process's defaults)."""
    if not getattr(args, "tune_memory", False):
        return None
    import fuseops

    return fuseops.cpu.tune_memory()


def run(args: argparse.Namespace, case_list: Optional[list] = None) -> int:
    """Runs the benchmark for parsed `args` (tests pass their own cases)."""
    if getattr(args, "markdown", None) is not None or getattr(args, "markdown_out", None):
        return markdown.run(args)
    if getattr(args, "transformers", None):
        return hf_models.run(args)
    if getattr(args, "decode", False):
        return decode.run(args)
    if getattr(args, "quality", False):
        return quality.run(args)
    for name, runtime in programs.RUNTIMES.items():
        if getattr(args, name, False):
            return programs.run(args, runtime)
    device = torch.device(args.device)
    problem = environment.check_device(device)
    if problem:
        print(f"fuseops bench: {problem}", file=sys.stderr)
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    memory_settings = _apply_memory_settings(args)
    if args.full and args.preset not in (None, "full"):
        print(
            f"fuseops bench: --full is --preset full, not --preset {args.preset}", file=sys.stderr
        )
        return 2
    preset_name = "full" if args.full else (args.preset or DEFAULT_PRESET)
    preset = PRESETS[preset_name]
    try:
        if case_list is not None:
            selected = case_list
        elif args.ops:
            selected = cases.by_name(args.ops)
        elif preset.cases == "per-family":
            selected = cases.one_per_family()
        else:
            selected = cases.by_name(variants=preset.cases == "all")
    except ValueError as error:
        print(f"fuseops bench: {error}", file=sys.stderr)
        return 2
    dtypes = parse_dtypes(args.dtype) if isinstance(args.dtype, str) else args.dtype
    shapes = args.shapes if args.shapes is not None else SHAPE_PRESETS[preset_name]
    if isinstance(shapes, str):
        shapes = parse_shapes(shapes)
    if args.modes is not None:
        modes = parse_modes(args.modes) if isinstance(args.modes, str) else args.modes
    else:
        modes = list(preset.modes)
    min_time = args.min_time if args.min_time is not None else preset.min_time
    os.makedirs(args.out, exist_ok=True)
    config = runner.Config(
        cases=selected,
        dtypes=dtypes,
        shapes=shapes,
        modes=modes,
        device=device,
        first_mode_only=preset.first_mode_only and args.modes is None,
        compile_peer=not args.no_compile,
        timer=timing.TimerSettings(min_time=min_time)
        if min_time is not None
        else timing.TimerSettings(),
        profile_dir=os.path.join(args.out, "profile") if args.profile else None,
        preset=_preset_of(shapes),
        bench_preset=preset_name,
    )
    env = environment.environment(config)
    env["memory_settings"] = memory_settings
    bench = runner.Runner(config)
    progress = Progress(bench.row_count(), not args.no_progress)
    bench.progress = progress.start
    rows = []
    try:
        for row in bench.run():
            rows.append(row)
            progress.finished(row)
    finally:
        progress.close()

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
        written.append(
            f"profiler traces {config.profile_dir}/ (open in chrome://tracing or Perfetto)"
        )
    print("wrote " + "; ".join(written))
    if preset_name in LONGER_RUNS and case_list is None and not args.ops:
        print("longer runs: " + "; ".join(LONGER_RUNS[preset_name]) + " (see --help)")
    return 1 if any(row.status in ("FAILED", "ERROR") for row in rows) else 0


__all__ = ["PRESETS", "SHAPE_PRESETS", "Progress", "add_arguments", "run"]
