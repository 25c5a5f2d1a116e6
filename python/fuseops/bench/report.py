"""Output of the benchmark: terminal table, JSON, CSV and a PNG chart."""

from __future__ import annotations

import csv
import json
from typing import Optional, Sequence

from .results import FRESH_GRAD, MODE_LABELS, MODES, PEERS, Row

PEER_COLUMNS = {"eager": "vs eager", "compiled": "vs compile", "native": "vs native"}


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


def _mib(value: Optional[int]) -> str:
    if value is None:
        return "-"
    mib = value / 2**20
    return f"{mib:.0f}" if mib >= 100 else f"{mib:.2g}" if mib < 1 else f"{mib:.1f}"


def header_lines(env: dict) -> list[str]:
    lines = [
        f"fuseops {env['fuseops_version']}, torch {env['torch_version']}, "
        f"Python {env['python_version']}",
        f"device {env['device']}" + (f" ({env['gpu']})" if env.get("gpu") else "")
        + f"; CPU {env['cpu_model']}, {env['logical_cpus']} logical CPUs, "
        f"last-level cache {env['last_level_cache_bytes'] / 2**20:.0f} MiB",
        f"threads {env['threads']}"
        + (f" (OMP_WAIT_POLICY={env['omp_wait_policy']})" if env.get("omp_wait_policy") else "")
        + f"; CPU capability: fuseops {env['fuseops_cpu_capability']} "
        f"(builds {', '.join(env['fuseops_cpu_builds'])}), ATen {env['aten_cpu_capability']}",
    ]
    memory = env.get("memory_settings")
    lines.append("memory: " + (
        f"fuseops.cpu.tune_memory(keep_bytes={memory['keep_bytes']}) for every peer"
        if memory else "process defaults"))
    if not env["compile_peer"]:
        lines.append("torch.compile peer skipped (--no-compile)")
    load = env.get("load_average_at_start")
    if env["device"] == "cpu" and load is not None and load >= 1.0:
        lines.append(f"note: the load average was {load:.1f} at the start (other processes "
                     f"share these {env['logical_cpus']} CPUs): expect noisy times and ratios")
        if (env.get("omp_wait_policy") or "").upper() != "PASSIVE":
            lines.append("      (OpenMP threads spin while they wait for a busy core; "
                         "OMP_WAIT_POLICY=PASSIVE makes that cheaper)")
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


def allocation_table(rows: Sequence[Row]) -> list[str]:
    """Bytes allocated per call in the fwd+bwd fresh grad rows, by fuseops
    and by each peer, and by fuseops in the fwd+bwd row (gradient held by
    the caller) of the same op, dtype and shape when the run has it: what
    writing the gradient over the incoming one saves. Empty without such rows."""
    fresh = [row for row in rows if row.mode == FRESH_GRAD and row.allocated_bytes is not None]
    if not fresh:
        return []
    held = {(row.op, row.dtype, row.shape): row.allocated_bytes for row in rows
            if row.mode == "forward+backward" and row.allocated_bytes is not None}
    columns = ["op", "dtype", "shape", "fuseops", "held grad", "eager", "compile", "native",
               "saved vs held", "vs eager", "vs compile"]
    body = []
    for row in fresh:
        peer = {name: (row.peers[name].allocated_bytes if name in row.peers else None)
                for name in PEERS}
        kept = held.get((row.op, row.dtype, row.shape))
        body.append([row.op, row.dtype, row.shape, _mib(row.allocated_bytes), _mib(kept),
                     *[_mib(peer[name]) for name in PEERS],
                     _saved(kept, row.allocated_bytes), _saved(peer["eager"], row.allocated_bytes),
                     _saved(peer["compiled"], row.allocated_bytes)])
    return ["", f"MiB allocated per call, {MODE_LABELS[FRESH_GRAD]}:"] + _aligned(
        columns, body, numeric=range(3, len(columns))) + [
        "fuseops / eager / compile / native: all the allocations of one call (however soon "
        "freed); held grad: fuseops in the fwd+bwd row, whose upstream gradient the caller "
        "keeps; saved: the difference to fuseops here"]


def table(rows: Sequence[Row], env: dict) -> str:
    """The results as an aligned text table, with notes on failures, errors
    and ops that are not built."""
    columns = ["op", "dtype", "shape", "mode", "time", "+-", *PEER_COLUMNS.values(),
               "GB/s", "copy%", "peak MiB", "cmp MiB", "max err", "status"]
    body = []
    for row in rows:
        if row.status == "not built":
            continue
        compiled = row.peers.get("compiled")
        body.append([
            row.op, row.dtype, row.shape, MODE_LABELS.get(row.mode, row.mode),
            _time(row.time.median_s if row.time else None),
            f"{row.time.spread * 100:.0f}%" if row.time else "-",
            *[_ratio(row.speedup(peer)) for peer in PEER_COLUMNS],
            "-" if row.gbps is None else f"{row.gbps:.1f}",
            "-" if row.roofline_fraction is None else f"{row.roofline_fraction * 100:.0f}%",
            _mib(row.peak_bytes),
            _mib(compiled.peak_bytes if compiled else None),
            "-" if row.max_abs_err is None else f"{row.max_abs_err:.1e}",
            row.status,
        ])
    out = header_lines(env) + [""]
    if body:
        out += _aligned(columns, body, numeric=range(4, len(columns) - 1))
    out += ["", "time: median per call (+- interquartile range); vs X: X's time / fuseops' time "
            "(>1: fuseops faster); GB/s: least bytes the op must move / time; copy%: a copy of "
            "the same bytes, same run, as a fraction of whose time fuseops takes; peak MiB / "
            "cmp MiB: most memory allocated during one call by fuseops / by "
            "torch.compile(reference); fwd out= rows compare against the peers' allocating "
            "forward, except native ops that have out="]
    out += allocation_table(rows)
    problems = [row for row in rows if row.status in ("FAILED", "ERROR")]
    for row in problems:
        out.append(f"!! {row.status}: {row.op} {row.dtype} {row.shape} "
                   f"{MODE_LABELS.get(row.mode, row.mode)}: {row.message}")
    peer_errors = [(row, name, peer) for row in rows for name, peer in row.peers.items()
                   if peer.error]
    for row, name, peer in peer_errors:
        out.append(f"note: peer {peer.label} could not run for {row.op} {row.dtype} "
                   f"{row.shape} {MODE_LABELS.get(row.mode, row.mode)}: {peer.error}")
    for row in rows:
        if row.status == "not built":
            out.append(f"not built: {row.op} ({row.message})")
    out.append(summary(rows))
    return "\n".join(out)


def summary(rows: Sequence[Row]) -> str:
    count = {status: sum(row.status == status for row in rows)
             for status in ("ok", "FAILED", "ERROR", "not built")}
    return (f"rows: {count['ok']} correct and timed, {count['FAILED']} FAILED, "
            f"{count['ERROR']} ERROR; ops not built: {count['not built']}")


def write_json(path: str, rows: Sequence[Row], env: dict) -> None:
    document = {
        "environment": env,
        "rows": [row.as_dict() for row in rows],
        "not_built": [row.op for row in rows if row.status == "not built"],
        "summary": summary(rows),
    }
    with open(path, "w") as f:
        json.dump(document, f, indent=2)
        f.write("\n")


def write_csv(path: str, rows: Sequence[Row], env: dict) -> None:
    fields = ["op", "dtype", "shape", "mode", "status", "time_median_s", "time_iqr_s",
              "samples", "bytes_moved", "gbps", "copy_gbps", "roofline_fraction", "peak_bytes",
              "max_abs_err", "error_ratio"]
    for peer in PEERS:
        fields += [f"{peer}_time_s", f"{peer}_speedup", f"{peer}_peak_bytes",
                   f"{peer}_max_abs_err", f"{peer}_variant"]
    fields += ["threads", "fuseops_cpu_capability", "device", "message", "allocated_bytes"]
    fields += [f"{peer}_allocated_bytes" for peer in PEERS]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            record = {
                "op": row.op, "dtype": row.dtype, "shape": row.shape, "mode": row.mode,
                "status": row.status,
                "time_median_s": row.time.median_s if row.time else None,
                "time_iqr_s": row.time.iqr_s if row.time else None,
                "samples": row.time.samples if row.time else None,
                "bytes_moved": row.bytes_moved, "gbps": row.gbps, "copy_gbps": row.copy_gbps,
                "roofline_fraction": row.roofline_fraction, "peak_bytes": row.peak_bytes,
                "max_abs_err": row.max_abs_err, "error_ratio": row.error_ratio,
                "threads": env["threads"],
                "fuseops_cpu_capability": env["fuseops_cpu_capability"],
                "device": env["device"], "message": row.message,
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


def _wrap(name: str, width: int = 12) -> str:
    """Breaks a long op name at the underscore nearest its middle."""
    if len(name) <= width or "_" not in name:
        return name
    cuts = [i for i, ch in enumerate(name) if ch == "_"]
    cut = min(cuts, key=lambda i: abs(i - len(name) / 2))
    return name[:cut + 1] + "\n" + name[cut + 1:]


def write_chart(path: str, rows: Sequence[Row], env: dict) -> bool:
    """Bar chart of fuseops' speedup over each peer, one panel per mode.
    Returns False (and writes nothing) when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    timed = [row for row in rows if row.status == "ok" and row.time is not None]
    modes = [mode for mode in MODES if any(row.mode == mode for row in timed)]
    if not modes:
        modes = ["forward"]
    fig, axes = plt.subplots(len(modes), 1, squeeze=False,
                             figsize=(max(6.0, 0.9 * max(1, len(timed) // len(modes)) + 3),
                                      3.6 * len(modes)))
    colors = {"eager": "#4c72b0", "compiled": "#dd8452", "native": "#55a868"}
    width = 0.8 / len(PEERS)
    for ax, mode in zip(axes[:, 0], modes):
        mode_rows = [row for row in timed if row.mode == mode]
        labels = [f"{_wrap(row.op)}\n{row.dtype}\n{row.shape}" for row in mode_rows]
        for k, peer in enumerate(PEERS):
            xs, heights = [], []
            for i, row in enumerate(mode_rows):
                value = row.speedup(peer)
                if value is not None:
                    xs.append(i + (k - (len(PEERS) - 1) / 2) * width)
                    heights.append(value)
            if xs:
                bars = ax.bar(xs, heights, width, label=f"vs {peer}", color=colors[peer])
                ax.bar_label(bars, labels=[f"{h:.2g}" for h in heights], fontsize=6,
                             padding=1)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xticks(range(len(mode_rows)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("speedup")
        ax.set_title(f"{MODE_LABELS[mode]}", fontsize=10)
        if mode_rows:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no timed rows", transform=ax.transAxes, ha="center")
    fig.suptitle(f"fuseops speedup (peer time / fuseops time), {env['device']}, "
                 f"{env['threads']} threads, {env['cpu_model']}", fontsize=9)
    problems = [f"{row.op} {row.dtype} {row.shape} {MODE_LABELS.get(row.mode, row.mode)}: "
                f"{row.status}" for row in rows if row.status in ("FAILED", "ERROR")]
    not_built = [row.op for row in rows if row.status == "not built"]
    notes = []
    if problems:
        notes.append("not shown, wrong or broken: " + "; ".join(problems))
    if not_built:
        notes.append("not built: " + ", ".join(not_built))
    fig.tight_layout(rect=(0, 0.03 * len(notes), 1, 1))
    for i, note in enumerate(notes):
        fig.text(0.01, 0.005 + 0.03 * i, note, fontsize=7, color="firebrick", wrap=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
