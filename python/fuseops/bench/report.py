"""Output of the benchmark: terminal table, JSON, CSV and a PNG chart."""

from __future__ import annotations

import csv
import json
import math
from typing import Optional, Sequence

from .results import BACKWARD_MODES, FRESH_GRAD, MODE_LABELS, MODES, PEERS, Row

PEER_COLUMNS = {"eager": "vs eager", "compiled": "vs compile", "native": "vs native"}
#: The floor: a fused op must not be slower than the path it replaces, the
#: native op or the eager composition, whichever is faster. A ratio below
#: 1.0x against either is marked FLOOR_MARK and the row listed.
FLOOR_PEERS = ("eager", "native")
FLOOR_MARK = "!"


def _time(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def _ratio(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}x"


def ratio_cell(value: Optional[float], peer: str) -> str:
    """A peer's ratio, marked where it puts fuseops below the floor."""
    below = peer in FLOOR_PEERS and value is not None and value < 1
    return _ratio(value) + (FLOOR_MARK if below else "")


def floor_ratio(row: Row) -> Optional[float]:
    """fuseops against the faster of eager and native (None without either)."""
    ratios = [r for r in (row.speedup(peer) for peer in FLOOR_PEERS) if r is not None]
    return min(ratios) if ratios else None


def below_floor(rows: Sequence[Row]) -> list[Row]:
    """The correct rows where fuseops is slower than eager or native."""
    return [
        row
        for row in rows
        if row.status == "ok" and (ratio := floor_ratio(row)) is not None and ratio < 1
    ]


def _mib(value: Optional[int]) -> str:
    if value is None:
        return "-"
    mib = value / 2**20
    return f"{mib:.0f}" if mib >= 100 else f"{mib:.2g}" if mib < 1 else f"{mib:.1f}"


def header_lines(env: dict) -> list[str]:
    lines = [
        f"fuseops {env['fuseops_version']}, torch {env['torch_version']}, "
        f"Python {env['python_version']}",
        f"device {env['device']}"
        + (f" ({env['gpu']})" if env.get("gpu") else "")
        + f"; CPU {env['cpu_model']}, {env['logical_cpus']} logical CPUs, "
        f"last-level cache {env['last_level_cache_bytes'] / 2**20:.0f} MiB",
        f"threads {env['threads']}"
        + (f" (OMP_WAIT_POLICY={env['omp_wait_policy']})" if env.get("omp_wait_policy") else "")
        + f"; CPU capability: fuseops {env['fuseops_cpu_capability']} "
        f"(builds {', '.join(env['fuseops_cpu_builds'])}), ATen {env['aten_cpu_capability']}",
    ]
    if env.get("preset"):
        lines.append(f"preset {env['preset']} (python -m fuseops bench --help: the presets)")
    memory = env.get("memory_settings")
    lines.append(
        "memory: "
        + (
            f"fuseops.cpu.tune_memory(keep_bytes={memory['keep_bytes']}) for every peer"
            if memory
            else "process defaults"
        )
    )
    if not env["compile_peer"]:
        lines.append("torch.compile peer skipped (--no-compile)")
    load = env.get("load_average_at_start")
    if env["device"] == "cpu" and load is not None and load >= 1.0:
        lines.append(
            f"note: the load average was {load:.1f} at the start (other processes "
            f"share these {env['logical_cpus']} CPUs): expect noisy times and ratios"
        )
        if (env.get("omp_wait_policy") or "").upper() != "PASSIVE":
            lines.append(
                "      (OpenMP threads spin while they wait for a busy core; "
                "OMP_WAIT_POLICY=PASSIVE makes that cheaper)"
            )
    return lines


def _aligned(columns: list[str], body: list[list], numeric: range) -> list[str]:
    """Header, rule and body lines; the `numeric` columns right-aligned."""
    widths = [max(len(str(c)) for c in column) for column in zip(columns, *body)]

    def line(cells):
        return "  ".join(
            str(c).rjust(w) if i in numeric else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    return [line(columns), line(["-" * w for w in widths])] + [line(r) for r in body]


def _saved(peer: Optional[int], fuseops: Optional[int]) -> str:
    if peer is None or fuseops is None:
        return "-"
    return ("-" if peer < fuseops else "") + _mib(abs(peer - fuseops))


#: The columns of the allocation table (the text report's and the Markdown's).
ALLOCATION_COLUMNS = [
    "op",
    "dtype",
    "shape",
    "fuseops",
    "held grad",
    "eager",
    "compile",
    "native",
    "saved vs held",
    "vs eager",
    "vs compile",
]


def allocation_table(rows: Sequence[Row]) -> list[str]:
    """Bytes allocated per call in the fwd+bwd fresh grad rows, by fuseops
    and by each peer, and by fuseops in the fwd+bwd row (gradient held by
    the caller) of the same op, dtype and shape when the run has it: what
    writing the gradient over the incoming one saves. Empty without such rows."""
    fresh = [row for row in rows if row.mode == FRESH_GRAD and row.allocated_bytes is not None]
    if not fresh:
        return []
    held = {
        (row.op, row.dtype, row.shape): row.allocated_bytes
        for row in rows
        if row.mode == "forward+backward" and row.allocated_bytes is not None
    }
    columns = ALLOCATION_COLUMNS
    body = []
    for row in fresh:
        peer = {
            name: (row.peers[name].allocated_bytes if name in row.peers else None) for name in PEERS
        }
        kept = held.get((row.op, row.dtype, row.shape))
        body.append(
            [
                row.op,
                row.dtype,
                row.shape,
                _mib(row.allocated_bytes),
                _mib(kept),
                *[_mib(peer[name]) for name in PEERS],
                _saved(kept, row.allocated_bytes),
                _saved(peer["eager"], row.allocated_bytes),
                _saved(peer["compiled"], row.allocated_bytes),
            ]
        )
    return (
        ["", f"MiB allocated per call, {MODE_LABELS[FRESH_GRAD]}:"]
        + _aligned(columns, body, numeric=range(3, len(columns)))
        + [
            "fuseops / eager / compile / native: all the allocations of one call (however soon "
            "freed); held grad: fuseops in the fwd+bwd row, whose upstream gradient the caller "
            "keeps; saved: the difference to fuseops here"
        ]
    )


def ops_columns(peer_columns: Sequence[str]) -> list[str]:
    """The columns of the ops' table, with the given peers' ratio columns."""
    return [
        "op",
        "dtype",
        "shape",
        "mode",
        "time",
        "+-",
        *peer_columns,
        "GB/s",
        "copy%",
        "peak MiB",
        "cmp MiB",
        "max err",
        "status",
    ]


def table(rows: Sequence[Row], env: dict) -> str:
    """The results as an aligned text table, with notes on failures, errors
    and ops that are not built."""
    columns = ops_columns(list(PEER_COLUMNS.values()))
    body = []
    for row in rows:
        if row.status == "not built":
            continue
        compiled = row.peers.get("compiled")
        body.append(
            [
                row.op,
                row.dtype,
                row.shape,
                MODE_LABELS.get(row.mode, row.mode),
                _time(row.time.median_s if row.time else None),
                f"{row.time.spread * 100:.0f}%" if row.time else "-",
                *[ratio_cell(row.speedup(peer), peer) for peer in PEER_COLUMNS],
                "-" if row.gbps is None else f"{row.gbps:.1f}",
                "-" if row.roofline_fraction is None else f"{row.roofline_fraction * 100:.0f}%",
                _mib(row.peak_bytes),
                _mib(compiled.peak_bytes if compiled else None),
                "-" if row.max_abs_err is None else f"{row.max_abs_err:.1e}",
                row.status,
            ]
        )
    out = header_lines(env) + [""]
    if body:
        out += _aligned(columns, body, numeric=range(4, len(columns) - 1))
    out += [
        "",
        "time: median per call (+- interquartile range); vs X: X's time / fuseops' time "
        "(>1: fuseops faster); GB/s: least bytes the op must move / time; copy%: a copy of "
        "the same bytes, same run, as a fraction of whose time fuseops takes; peak MiB / "
        "cmp MiB: most memory allocated during one call by fuseops / by "
        "torch.compile(reference); fwd out= rows compare against the peers' allocating "
        "forward, except native ops that have out=; "
        f"{FLOOR_MARK}: below 1.0x against eager or native, the floor (fuseops slower than "
        "the path it replaces)",
    ]
    out += allocation_table(rows)
    slow = below_floor(rows)
    if slow:
        out += ["", f"{FLOOR_MARK} below the floor (the slower of eager and native / fuseops):"]
        out += [
            f"   {row.op} {row.dtype} {row.shape} {MODE_LABELS.get(row.mode, row.mode)}: "
            f"{_ratio(floor_ratio(row))}"
            for row in slow
        ]
    problems = [row for row in rows if row.status in ("FAILED", "ERROR")]
    for row in problems:
        out.append(
            f"!! {row.status}: {row.op} {row.dtype} {row.shape} "
            f"{MODE_LABELS.get(row.mode, row.mode)}: {row.message}"
        )
    peer_errors = [
        (row, name, peer) for row in rows for name, peer in row.peers.items() if peer.error
    ]
    for row, _name, peer in peer_errors:
        out.append(
            f"note: peer {peer.label} could not run for {row.op} {row.dtype} "
            f"{row.shape} {MODE_LABELS.get(row.mode, row.mode)}: {peer.error}"
        )
    for row in rows:
        if row.status == "not built":
            out.append(f"not built: {row.op} ({row.message})")
    out.append(summary(rows))
    return "\n".join(out)


def summary(rows: Sequence[Row]) -> str:
    count = {
        status: sum(row.status == status for row in rows)
        for status in ("ok", "FAILED", "ERROR", "not built")
    }
    return (
        f"rows: {count['ok']} correct and timed, {count['FAILED']} FAILED, "
        f"{count['ERROR']} ERROR, {len(below_floor(rows))} below the floor "
        f"(slower than eager or native); ops not built: {count['not built']}"
    )


def write_json(path: str, rows: Sequence[Row], env: dict) -> None:
    document = {
        "environment": env,
        "rows": [row.as_dict() for row in rows],
        "not_built": [row.op for row in rows if row.status == "not built"],
        "below_floor": [
            {
                "op": row.op,
                "dtype": row.dtype,
                "shape": row.shape,
                "mode": row.mode,
                "floor_ratio": floor_ratio(row),
            }
            for row in below_floor(rows)
        ],
        "summary": summary(rows),
    }
    with open(path, "w") as f:
        json.dump(document, f, indent=2)
        f.write("\n")


def write_csv(path: str, rows: Sequence[Row], env: dict) -> None:
    fields = [
        "op",
        "dtype",
        "shape",
        "mode",
        "status",
        "time_median_s",
        "time_iqr_s",
        "samples",
        "bytes_moved",
        "gbps",
        "copy_gbps",
        "roofline_fraction",
        "peak_bytes",
        "max_abs_err",
        "error_ratio",
    ]
    for peer in PEERS:
        fields += [
            f"{peer}_time_s",
            f"{peer}_speedup",
            f"{peer}_peak_bytes",
            f"{peer}_max_abs_err",
            f"{peer}_variant",
        ]
    fields += ["threads", "fuseops_cpu_capability", "device", "message", "allocated_bytes"]
    fields += [f"{peer}_allocated_bytes" for peer in PEERS]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            record = {
                "op": row.op,
                "dtype": row.dtype,
                "shape": row.shape,
                "mode": row.mode,
                "status": row.status,
                "time_median_s": row.time.median_s if row.time else None,
                "time_iqr_s": row.time.iqr_s if row.time else None,
                "samples": row.time.samples if row.time else None,
                "bytes_moved": row.bytes_moved,
                "gbps": row.gbps,
                "copy_gbps": row.copy_gbps,
                "roofline_fraction": row.roofline_fraction,
                "peak_bytes": row.peak_bytes,
                "max_abs_err": row.max_abs_err,
                "error_ratio": row.error_ratio,
                "threads": env["threads"],
                "fuseops_cpu_capability": env["fuseops_cpu_capability"],
                "device": env["device"],
                "message": row.message,
                "allocated_bytes": row.allocated_bytes,
            }
            for name, peer in row.peers.items():
                record[f"{name}_time_s"] = peer.time.median_s if peer.time else None
                record[f"{name}_speedup"] = row.speedup(name)
                record[f"{name}_peak_bytes"] = peer.peak_bytes
                record[f"{name}_max_abs_err"] = peer.max_abs_err
                record[f"{name}_variant"] = peer.variant
                record[f"{name}_allocated_bytes"] = peer.allocated_bytes
            writer.writerow({k: ("" if v is None else v) for k, v in record.items()})


def row_line(row: Row) -> str:
    """One finished row on one line: its time, its ratios and its status."""
    if row.status == "not built":
        return f"{row.op}: not built"
    name = f"{row.op} {row.dtype} {row.shape} {MODE_LABELS.get(row.mode, row.mode)}"
    if row.time is None:
        return f"{name}: {row.status}"
    ratios = ", ".join(
        f"{PEER_COLUMNS[peer]} {ratio_cell(row.speedup(peer), peer)}"
        for peer in PEERS
        if row.speedup(peer) is not None
    )
    return (
        f"{name}: {_time(row.time.median_s)}"
        + (f" ({ratios})" if ratios else "")
        + (f", {row.status}")
    )


#: The chart's layout, in inches: one cell per ratio, a label per line.
CELL_WIDTH, CELL_HEIGHT, CHAR_WIDTH = 0.4, 0.22, 0.056
#: The chart's labels name dtypes short.
SHORT_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64"}
#: Lines per panel, at the least; panels grow taller from there while the
#: panels side by side would be wider than MAX_WIDTH inches.
PANEL_LINES, MAX_WIDTH = 45, 17.0
#: Ratios beyond 2**+-RATIO_RANGE_LOG2 take the end colours.
RATIO_RANGE_LOG2 = 3
DPI = 110


def _chart_label(line: tuple) -> str:
    _, op, dtype, shape = line
    return f"{op}  {SHORT_DTYPES.get(dtype, dtype)}  {shape}"


def _label_width(lines: Sequence[tuple]) -> float:
    return 0.3 + CHAR_WIDTH * max((len(_chart_label(line)) for line in lines), default=10)


def chart_panels(rows: Sequence[Row]) -> tuple[list[tuple[list, list]], dict]:
    """(panels, ratios) of the speedup chart. A line per (family, op, dtype,
    shape) in run order; the lines with backward rows come first, then the
    forward-only ones (inference ops), each group with its own columns, one
    per (mode, peer) it has a ratio in, so that neither shows the other's
    empty cells. A group too long for one panel is split evenly into panels
    side by side. `ratios` maps (line, (mode, peer)) to the peer's time over
    fuseops'."""
    timed = [row for row in rows if row.status == "ok" and row.time is not None]
    lines = list(dict.fromkeys((row.family, row.op, row.dtype, row.shape) for row in timed))
    ratios = {}
    for row in timed:
        for peer in PEERS:
            value = row.speedup(peer)
            if value is not None:
                ratios[(row.family, row.op, row.dtype, row.shape), (row.mode, peer)] = value
    backward = {line for line, (mode, _) in ratios if mode in BACKWARD_MODES}
    groups = [
        group
        for group in (
            [line for line in lines if line in backward],
            [line for line in lines if line not in backward],
        )
        if group
    ]
    grouped = []
    for group in groups:
        members = set(group)
        present = {column for line, column in ratios if line in members}
        grouped.append(
            (group, [(mode, peer) for mode in MODES for peer in PEERS if (mode, peer) in present])
        )

    def split(per_panel: int) -> list[tuple[list, list]]:
        panels = []
        for group, columns in grouped:
            count = math.ceil(len(group) / per_panel)
            size = math.ceil(len(group) / count)
            panels += [(group[i : i + size], columns) for i in range(0, len(group), size)]
        return panels

    def width(panels) -> float:
        return sum(_label_width(chunk) + CELL_WIDTH * len(columns) for chunk, columns in panels)

    per_panel = PANEL_LINES
    while per_panel < len(lines) and width(split(per_panel)) > MAX_WIDTH:
        per_panel += 5
    return split(per_panel) if grouped else [([], [])], ratios


def write_chart(path: str, rows: Sequence[Row], env: dict) -> bool:
    """Heatmap of fuseops' speedup over each peer: a line per op, dtype and
    shape, a column per mode and peer, each cell coloured by the ratio and
    labelled with it; long runs wrap into panels side by side (chart_panels).
    Returns False (and writes nothing) when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib import colors as mcolors

    panels, ratios = chart_panels(rows)
    problems = [
        f"{row.op} {row.dtype} {row.shape} {MODE_LABELS.get(row.mode, row.mode)}: {row.status}"
        for row in rows
        if row.status in ("FAILED", "ERROR")
    ]
    not_built = [row.op for row in rows if row.status == "not built"]
    notes = []
    if problems:
        notes.append("not shown, wrong or broken: " + "; ".join(problems))
    if not_built:
        notes.append("not built: " + ", ".join(not_built))
    tallest = max(1, max(len(chunk) for chunk, _ in panels))
    widths = [_label_width(chunk) + CELL_WIDTH * max(1, len(columns)) for chunk, columns in panels]
    top, bottom, margin = 1.2, 1.0 + 0.2 * len(notes), 0.2
    width = max(5.5, 2 * margin + sum(widths))
    height = top + bottom + CELL_HEIGHT * tallest
    fig = plt.figure(figsize=(width, height))
    cmap = plt.get_cmap("RdBu").with_extremes(bad="#e4e4e4")
    norm = mcolors.Normalize(-RATIO_RANGE_LOG2, RATIO_RANGE_LOG2)
    image = None
    left = margin
    for (chunk, columns), panel_width in zip(panels, widths):
        cells = max(1, len(columns))
        ax = fig.add_axes(
            [
                (left + panel_width - CELL_WIDTH * cells) / width,
                (height - top - CELL_HEIGHT * max(1, len(chunk))) / height,
                CELL_WIDTH * cells / width,
                CELL_HEIGHT * max(1, len(chunk)) / height,
            ]
        )
        left += panel_width
        values = np.full((max(1, len(chunk)), cells), np.nan)
        for i, line in enumerate(chunk):
            for j, column in enumerate(columns):
                value = ratios.get((line, column))
                if value is None:
                    continue
                values[i, j] = math.log2(value)
                dark = abs(math.log2(value)) > 0.6 * RATIO_RANGE_LOG2
                ax.text(
                    j,
                    i,
                    f"{value:.2g}",
                    ha="center",
                    va="center",
                    fontsize=6.5,
                    color="white" if dark else "black",
                )
        image = ax.imshow(values, cmap=cmap, norm=norm, aspect="auto", interpolation="none")
        ax.set_yticks(range(len(chunk)))
        ax.set_yticklabels([_chart_label(line) for line in chunk], fontsize=7)
        ax.set_xticks(range(len(columns)))
        ax.set_xticklabels(
            [PEER_COLUMNS[peer].removeprefix("vs ") for _, peer in columns], fontsize=7
        )
        ax.xaxis.tick_top()
        ax.tick_params(length=0)
        for j, (mode, _) in enumerate(columns):
            if j == 0 or columns[j - 1][0] != mode:
                span = sum(1 for m, _ in columns if m == mode)
                ax.text(
                    j + (span - 1) / 2,
                    -1.6,
                    MODE_LABELS[mode],
                    ha="center",
                    va="bottom",
                    fontsize=7.5,
                    fontweight="bold",
                )
                if j:
                    ax.axvline(j - 0.5, color="white", linewidth=2)
        for i in range(1, len(chunk)):
            if chunk[i][0] != chunk[i - 1][0]:
                ax.axhline(i - 0.5, color="black", linewidth=0.8)
        for spine in ax.spines.values():
            spine.set_visible(False)
        if not chunk:
            ax.text(0, 0, "no timed rows", ha="center", va="center")
    fig.text(
        margin / width,
        1 - 0.12 / height,
        "fuseops speedup: peer's time / fuseops' time (above 1, blue: fuseops faster)\n"
        f"{env['device']}, {env['threads']} threads, {env['cpu_model']}"
        + (f"; preset {env['preset']}" if env.get("preset") else ""),
        fontsize=8,
        va="top",
    )
    bar = fig.add_axes(
        [
            margin / width,
            (bottom - 0.45) / height,
            min(3.5, width - 2 * margin) / width,
            0.12 / height,
        ]
    )
    ticks = list(range(-RATIO_RANGE_LOG2, RATIO_RANGE_LOG2 + 1))
    colorbar = fig.colorbar(image, cax=bar, orientation="horizontal", ticks=ticks)
    colorbar.ax.set_xticklabels([f"{2.0**t:g}x" for t in ticks], fontsize=7)
    colorbar.ax.set_title("ratio (grey: no such peer or mode)", fontsize=7, loc="left")
    for i, note in enumerate(notes):
        fig.text(
            margin / width,
            (0.05 + 0.2 * i) / height,
            note,
            fontsize=7,
            color="firebrick",
            wrap=True,
        )
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return True
