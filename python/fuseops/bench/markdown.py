"""``python -m fuseops bench --markdown [JSON]``: the results of an earlier
run, read back from its JSON (``bench.json`` of the ops, or ``decode.json``
of ``--decode``), as GitHub Markdown tables to paste into PERFORMANCE.md.
Nothing is run: every number is the JSON's, formatted as the text report
formats it, and a field the JSON lacks prints "-".

The ops: a line naming the machine, the versions, the date and the load
average, then one table per op family with the text table's columns (and the
text report's allocation table, notes and summary under them). Decode: the
same line, then one table per model size with the decode table's columns,
and under it one bar chart of tokens/s per batch size (a ```mermaid
``xychart-beta``, which GitHub draws), the variants in the table's order.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Iterable, Optional, Sequence

from . import decode, report
from .results import FRESH_GRAD, MODE_LABELS, PEERS

MISSING = "-"


def _get(mapping: Any, *keys: str) -> Any:
    """mapping[k1][k2]..., or None where a level is missing or not a dict."""
    for key in keys:
        if not isinstance(mapping, dict):
            return None
        mapping = mapping.get(key)
    return mapping


def _num(value: Any) -> Optional[float]:
    """`value` when it is a number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _int(value: Any) -> Optional[int]:
    number = _num(value)
    return None if number is None else int(number)


def _text(value: Any) -> str:
    return MISSING if value is None or value == "" else str(value)


def _cell(value: Any) -> str:
    """A table cell: never empty, one line, its pipes escaped."""
    text = " ".join(_text(value).split())
    return text.replace("|", "\\|") or MISSING


def markdown_table(columns: Sequence[str], body: Iterable[Sequence[Any]], numeric) -> list[str]:
    """Header, separator and body lines of a GitHub table; the `numeric`
    columns (indices) right-aligned."""
    lines = [
        "| " + " | ".join(_cell(c) for c in columns) + " |",
        "| " + " | ".join("---:" if i in numeric else "---" for i in range(len(columns))) + " |",
    ]
    for cells in body:
        assert len(cells) == len(columns), (cells, columns)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _fixed(value: Any, digits: int, scale: float = 1.0) -> str:
    number = _num(value)
    return MISSING if number is None else f"{number / scale:.{digits}f}"


def _load(env: dict) -> str:
    load = _num(env.get("load_average_at_start"))
    return MISSING if load is None else f"{load:.1f}"


# ---------------------------------------------------------------------------
# The ops' bench.json


def ops_header(env: dict) -> str:
    """One line: the machine, the versions, the date and the load average."""
    device = _text(env.get("device"))
    if env.get("gpu"):
        device += f" ({env['gpu']})"
    policy = env.get("omp_wait_policy")
    parts = [
        f"fuseops {_text(env.get('fuseops_version'))}, torch {_text(env.get('torch_version'))}",
        f"device {device}, CPU {_text(env.get('cpu_model'))} "
        f"({_text(env.get('logical_cpus'))} logical CPUs), "
        f"ISA fuseops {_text(env.get('fuseops_cpu_capability'))} / "
        f"ATen {_text(env.get('aten_cpu_capability'))}, {_text(env.get('threads'))} threads"
        + (f", OMP_WAIT_POLICY={policy}" if policy else ""),
        f"date {_text(env.get('date'))}",
        f"load average {_load(env)} at the start",
    ]
    if env.get("preset"):
        parts.append(f"preset {env['preset']}")
    if env.get("compile_peer") is False:
        parts.append("torch.compile peer skipped")
    return "; ".join(parts)


def _peer_names(rows: Sequence[dict]) -> list[str]:
    """The text table's peers, then any other peer the rows have."""
    names = list(report.PEER_COLUMNS)
    for row in rows:
        for name in row.get("peers") or {}:
            if name not in names:
                names.append(name)
    return names


def _median(timing: Any) -> Optional[float]:
    return _num(_get(timing, "median_s"))


def _speedup(row: dict, peer: str) -> Optional[float]:
    """The peer's time over fuseops' as recorded, else from the recorded times."""
    recorded = _num(_get(row, "peers", peer, "speedup"))
    if recorded is not None:
        return recorded
    mine, theirs = _median(row.get("time")), _median(_get(row, "peers", peer, "time"))
    return theirs / mine if mine and theirs is not None else None


def _spread(row: dict) -> str:
    median, iqr = _median(row.get("time")), _num(_get(row, "time", "iqr_s"))
    if median is None or iqr is None:
        return MISSING
    return f"{(iqr / median if median > 0 else 0.0) * 100:.0f}%"


def _copy_fraction(row: dict) -> Optional[float]:
    recorded = _num(row.get("roofline_fraction"))
    if recorded is not None:
        return recorded
    mine, copy = _median(row.get("time")), _median(row.get("copy_time"))
    return copy / mine if mine and copy is not None else None


def _mode(row: dict) -> str:
    mode = row.get("mode")
    return MODE_LABELS.get(mode, mode) if isinstance(mode, str) else _text(mode)


def ops_cells(row: dict, peers: Sequence[str]) -> list[str]:
    """A row of the text table (report.table), from the row's JSON record."""
    gbps, fraction = _num(row.get("gbps")), _copy_fraction(row)
    error = _num(row.get("max_abs_err"))
    return [
        _text(row.get("op")),
        _text(row.get("dtype")),
        _text(row.get("shape")),
        _mode(row),
        report._time(_median(row.get("time"))),
        _spread(row),
        *[report.ratio_cell(_speedup(row, peer), peer) for peer in peers],
        MISSING if gbps is None else f"{gbps:.1f}",
        MISSING if fraction is None else f"{fraction * 100:.0f}%",
        report._mib(_int(row.get("peak_bytes"))),
        report._mib(_int(_get(row, "peers", "compiled", "peak_bytes"))),
        MISSING if error is None else f"{error:.1e}",
        _text(row.get("status")),
    ]


def ops_columns(peers: Sequence[str]) -> list[str]:
    return report.ops_columns([report.PEER_COLUMNS.get(peer, f"vs {peer}") for peer in peers])


def _allocation_table(rows: Sequence[dict]) -> list[str]:
    """report.allocation_table as Markdown."""
    fresh = [
        row
        for row in rows
        if row.get("mode") == FRESH_GRAD and _int(row.get("allocated_bytes")) is not None
    ]
    if not fresh:
        return []
    held = {
        (row.get("op"), row.get("dtype"), row.get("shape")): _int(row.get("allocated_bytes"))
        for row in rows
        if row.get("mode") == "forward+backward" and _int(row.get("allocated_bytes")) is not None
    }
    columns = report.ALLOCATION_COLUMNS
    body = []
    for row in fresh:
        mine = _int(row.get("allocated_bytes"))
        peer = {name: _int(_get(row, "peers", name, "allocated_bytes")) for name in PEERS}
        kept = held.get((row.get("op"), row.get("dtype"), row.get("shape")))
        body.append(
            [
                _text(row.get("op")),
                _text(row.get("dtype")),
                _text(row.get("shape")),
                report._mib(mine),
                report._mib(kept),
                *[report._mib(peer[name]) for name in PEERS],
                report._saved(kept, mine),
                report._saved(peer["eager"], mine),
                report._saved(peer["compiled"], mine),
            ]
        )
    return [
        "",
        f"MiB allocated per call, {MODE_LABELS[FRESH_GRAD]}:",
        "",
        *markdown_table(columns, body, numeric=range(3, len(columns))),
    ]


def _family(row: dict) -> str:
    return _text(row.get("family"))


def ops_markdown(document: dict) -> str:
    env = document.get("environment") or {}
    rows = [row for row in document.get("rows") or [] if isinstance(row, dict)]
    shown = [row for row in rows if row.get("status") != "not built"]
    peers = _peer_names(shown)
    columns = ops_columns(peers)
    out = [ops_header(env)]
    families = list(dict.fromkeys(_family(row) for row in shown))
    for family in families:
        body = [ops_cells(row, peers) for row in shown if _family(row) == family]
        out += ["", f"#### {family}", ""]
        out += markdown_table(columns, body, numeric=range(4, len(columns) - 1))
    out += [
        "",
        "time: median per call (+-: interquartile range / median); vs X: X's time / fuseops' "
        "time (>1: fuseops faster); GB/s: least bytes the op must move / time; copy%: a copy "
        "of the same bytes, same run, as a fraction of whose time fuseops takes; peak MiB / "
        "cmp MiB: most memory allocated during one call by fuseops / by "
        f"torch.compile(reference); {report.FLOOR_MARK}: below 1.0x against eager or native, "
        "the floor (fuseops slower than the path it replaces)",
    ]
    out += _allocation_table(shown)
    notes = []
    for row in rows:
        name = f"{_text(row.get('op'))} {_text(row.get('dtype'))} {_text(row.get('shape'))}"
        if row.get("status") in ("FAILED", "ERROR"):
            notes.append(f"{row['status']}: {name} {_mode(row)}: {_text(row.get('message'))}")
        for peer in (row.get("peers") or {}).values():
            if isinstance(peer, dict) and peer.get("error"):
                notes.append(
                    f"note: peer {_text(peer.get('label'))} could not run for {name} "
                    f"{_mode(row)}: {peer['error']}"
                )
        if row.get("status") == "not built":
            notes.append(f"not built: {_text(row.get('op'))} ({_text(row.get('message'))})")
    if notes:
        out += [""] + [f"- {' '.join(note.split())}" for note in notes]
    if document.get("summary"):
        out += ["", str(document["summary"])]
    return "\n".join(out)


# ---------------------------------------------------------------------------
# The --decode run's decode.json


def decode_header(document: dict) -> str:
    env = document.get("environment") or {}
    policy = env.get("omp_wait_policy")
    return "; ".join(
        [
            f"fuseops {_text(env.get('fuseops_version'))}, torch "
            f"{_text(env.get('torch_version'))}, transformers "
            f"{_text(env.get('transformers_version'))}",
            f"CPU {_text(env.get('cpu_model'))} ({_text(env.get('logical_cpus'))} logical "
            f"CPUs), ISA fuseops {_text(env.get('fuseops_cpu_capability'))}, "
            f"{_text(env.get('threads'))} threads, OMP_WAIT_POLICY "
            + (policy if policy else "unset"),
            f"date {_text(env.get('date'))}",
            f"load average {_load(env)} at the start",
            f"copy {_fixed(document.get('copy_gb_per_s'), 1)} GB/s",
            f"read {_fixed(document.get('read_gb_per_s'), 1)} GB/s",
        ]
    )


def decode_size_line(result: dict, document: dict) -> str:
    config = result.get("config") or {}
    parameters = _num(result.get("parameters"))
    return (
        f"#### size {_text(result.get('size'))}: LlamaForCausalLM, hidden "
        f"{_text(config.get('hidden'))}, {_text(config.get('layers'))} layers, "
        f"{_text(config.get('heads'))}/{_text(config.get('kv_heads'))} heads, intermediate "
        f"{_text(config.get('intermediate'))}, vocab {_text(config.get('vocab'))}, "
        f"{MISSING if parameters is None else f'{parameters / 1e6:.1f}M'} parameters; prompt "
        f"{_text(document.get('prompt_tokens'))}, {_text(document.get('new_tokens'))} new "
        f"tokens, greedy, median of {_text(document.get('repeats'))}"
    )


def _label(value: Any) -> str:
    # A quoted label of mermaid's: no double quote inside.
    return '"' + _text(value).replace('"', "'") + '"'


def decode_charts(result: dict) -> list[str]:
    """Under a size's table: for each batch size, a horizontal bar chart of
    the tokens/s of every variant that has one at that batch size."""
    bars: dict[int, list[tuple[str, float]]] = {}
    for row in result.get("rows") or []:
        if not isinstance(row, dict) or "error" in row:
            continue
        for b in row.get("batches") or []:
            batch = _int(b.get("batch")) if isinstance(b, dict) else None
            tokens = _num(b.get("tokens_per_s")) if isinstance(b, dict) else None
            if batch is not None and tokens is not None:
                bars.setdefault(batch, []).append((_text(row.get("variant")), tokens))
    out = []
    for batch, series in sorted(bars.items()):
        top = max(tokens for _, tokens in series)
        out += [
            "",
            "```mermaid",
            "xychart-beta horizontal",
            f'    title "size {_text(result.get("size"))}, batch {batch}: tokens/s"',
            "    x-axis [" + ", ".join(_label(name) for name, _ in series) + "]",
            f'    y-axis "tokens/s" 0 --> {max(1, int(top * 1.1 + 1))}',
            "    bar [" + ", ".join(f"{tokens:.1f}" for _, tokens in series) + "]",
            "```",
        ]
    return out


def decode_markdown(document: dict) -> str:
    out = [decode_header(document)]
    for result in document.get("results") or []:
        if not isinstance(result, dict):
            continue
        body = []
        for row in result.get("rows") or []:
            if not isinstance(row, dict):
                continue
            if "error" in row:
                body.append(
                    [_text(row.get("variant")), f"ERROR: {_text(row['error'])}"]
                    + [MISSING] * (len(decode.TABLE_COLUMNS) - 2)
                )
                continue
            batches = [b for b in row.get("batches") or [] if isinstance(b, dict)]
            body += [decode.batch_cells(row, b) for b in batches]
        out += ["", decode_size_line(result, document), ""]
        out += markdown_table(
            decode.TABLE_COLUMNS, body, numeric=range(1, len(decode.TABLE_COLUMNS))
        )
        out += decode_charts(result)
    if document.get("llama_cpp"):
        out += ["", str(document["llama_cpp"])]
    return "\n".join(out)


# ---------------------------------------------------------------------------
# The command


def render(document: Any) -> str:
    """The Markdown of a bench.json or decode.json document; ValueError for
    anything else."""
    if isinstance(document, dict) and isinstance(document.get("rows"), list):
        return ops_markdown(document)
    if (
        isinstance(document, dict)
        and isinstance(document.get("results"), list)
        and all(isinstance(r, dict) and "rows" in r for r in document["results"])
    ):
        return decode_markdown(document)
    raise ValueError(
        "neither the JSON of `python -m fuseops bench` (a 'rows' list) nor that of "
        "`bench --decode` (a 'results' list of sizes with their 'rows')"
    )


def run(args: argparse.Namespace) -> int:
    """Prints (or, with --markdown-out, writes) the Markdown of the JSON
    --markdown names (default OUT/bench.json)."""
    path = args.markdown or os.path.join(args.out, "bench.json")
    try:
        with open(path) as f:
            document = json.load(f)
        text = render(document)
    except (OSError, ValueError) as error:
        print(f"fuseops bench --markdown: {path}: {error}", file=sys.stderr)
        return 2
    if args.markdown_out:
        folder = os.path.dirname(args.markdown_out)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(args.markdown_out, "w") as f:
            f.write(text + "\n")
        print(f"wrote {args.markdown_out}")
    else:
        print(text)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--markdown",
        nargs="?",
        const="",
        default=None,
        metavar="JSON",
        help="run nothing: print the results of JSON (default OUT/bench.json, i.e. "
        "bench-results/bench.json; a --decode run's decode.json too) as GitHub Markdown "
        "tables for PERFORMANCE.md: the machine, versions, date and load average, then a "
        "table per op family (per model size for --decode)",
    )
    parser.add_argument(
        "--markdown-out",
        default=None,
        metavar="PATH",
        help="write the --markdown tables to PATH instead of printing them (implies --markdown)",
    )


__all__ = ["add_arguments", "decode_markdown", "ops_markdown", "render", "run"]
