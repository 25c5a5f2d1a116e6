"""`python -m fuseops bench --markdown [JSON]`: an earlier run's JSON as
GitHub Markdown tables. The ops' JSON comes from a real run at the tiny
settings of test_bench.py; the decode JSON is built by hand as
`bench --decode` writes it (bench/decode.py, run()). Every row must appear
once, with the text report's formatting of the JSON's numbers, in tables
of one column count per line under a separator row."""

from __future__ import annotations

import argparse
import copy
import json
import re

import pytest

from fuseops.__main__ import main
from fuseops.bench import decode, markdown, report
from fuseops.bench.results import FRESH_GRAD, MODE_LABELS

RUN = [
    "--shapes",
    "32x160",
    "--min-time",
    "0.005",
    "--no-progress",
    "--ops",
    "relu,rms_norm",
    "--dtype",
    "float32",
    "--modes",
    "forward,fresh-grad",
    "--no-compile",
    "--no-plot",
]
OPS_COLUMNS = [
    "op",
    "dtype",
    "shape",
    "mode",
    "time",
    "+-",
    "vs eager",
    "vs compile",
    "vs native",
    "GB/s",
    "copy%",
    "peak MiB",
    "cmp MiB",
    "max err",
    "status",
]
SEPARATOR = re.compile(r"^:?-{3,}:?$")


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """(folder, document) of one tiny bench run: two op families, a forward
    and a fresh grad row each, no torch.compile peer."""
    out = tmp_path_factory.mktemp("bench")
    assert main(["bench", "--out", str(out), *RUN]) == 0
    return out, json.loads((out / "bench.json").read_text())


def cells(line: str) -> list[str]:
    """The cells of a Markdown table line, split at its unescaped pipes."""
    assert line.startswith("| ") and line.endswith(" |"), line
    return [c.strip() for c in re.split(r"(?<!\\)\|", line[1:-1])]


def tables(text: str) -> list[tuple[str, list[list[str]]]]:
    """(the last non-table line before it, [header, *body]) per table, each
    checked to be a valid GitHub table: one column count on every line, a
    separator row second, no empty cell."""
    found, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        if not lines[i].startswith("|"):
            i += 1
            continue
        start = i
        while i < len(lines) and lines[i].startswith("|"):
            i += 1
        block = [cells(line) for line in lines[start:i]]
        assert start > 0 and lines[start - 1] == "", "a table must follow a blank line"
        width = len(block[0])
        assert all(len(row) == width for row in block), lines[start:i]
        assert len(block) >= 3 and all(SEPARATOR.match(c) for c in block[1]), lines[start:i]
        assert all(c for row in block for c in row), lines[start:i]
        title = next(line for line in reversed(lines[:start]) if line)
        found.append((title, [block[0]] + block[2:]))
    return found


def text_table_rows(bench_txt: str) -> dict[tuple, list[str]]:
    """The text report's main table (bench.txt), row by row: its columns are
    separated by at least two spaces, a cell holds at most one."""
    lines = bench_txt.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("op "))
    assert re.split(r"\s{2,}", lines[start]) == OPS_COLUMNS
    rows = {}
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        row = re.split(r"\s{2,}", line.strip())
        assert len(row) == len(OPS_COLUMNS), line
        rows[tuple(row[:4])] = row
    return rows


def render(capsys, *argv: str) -> str:
    assert main(["bench", *argv]) == 0
    return capsys.readouterr().out


def test_bench_json_as_markdown(bench_run, capsys):
    out, document = bench_run
    text = render(capsys, "--markdown", str(out / "bench.json"))
    env = document["environment"]
    header = text.split("\n")[0]
    for field in ("cpu_model", "date", "fuseops_version", "torch_version"):
        assert env[field] and str(env[field]) in header, field
    assert f"ISA fuseops {env['fuseops_cpu_capability']} / ATen {env['aten_cpu_capability']}" in (
        header
    )
    assert f"{env['threads']} threads" in header
    assert f"load average {env['load_average_at_start']:.1f} at the start" in header

    found = tables(text)
    op_tables = [(title, rows) for title, rows in found if rows[0][:2] == ["op", "dtype"]]
    main_tables = [(title, rows) for title, rows in op_tables if rows[0] == OPS_COLUMNS]
    # One table per op family, headed by its name, holding that family's rows only.
    assert [title for title, _ in main_tables] == ["#### relu", "#### rms_norm"]
    for title, rows in main_tables:
        assert {row[0] for row in rows[1:]} == {title.removeprefix("#### ")}
    shown = [row for _, rows in main_tables for row in rows[1:]]

    # Every row of the JSON once, each cell as the text report (bench.txt) has it.
    keys = [(r["op"], r["dtype"], r["shape"], MODE_LABELS[r["mode"]]) for r in document["rows"]]
    assert len(keys) == 4 and sorted(tuple(row[:4]) for row in shown) == sorted(keys)
    text_rows = text_table_rows((out / "bench.txt").read_text())
    assert {tuple(row[:4]): row for row in shown} == text_rows

    # A few cells against the JSON itself.
    by_key = {tuple(row[:4]): dict(zip(OPS_COLUMNS, row)) for row in shown}
    for record, key in zip(document["rows"], keys):
        row = by_key[key]
        assert row["time"] == report._time(record["time"]["median_s"])
        eager = record["peers"]["eager"]["speedup"]
        # Below 1.0x against eager, the floor's mark.
        assert row["vs eager"] == f"{eager:.2f}x" + ("!" if eager < 1 else "")
        assert row["vs compile"] == "-"  # --no-compile
        assert row["copy%"] == f"{record['roofline_fraction'] * 100:.0f}%"
        assert row["GB/s"] == f"{record['gbps']:.1f}"
        assert row["peak MiB"] == report._mib(record["peak_bytes"])
        assert row["status"] == "ok"

    # The fresh grad rows' allocation table, as in the text report.
    [(title, allocated)] = [t for t in op_tables if t[0].startswith("MiB allocated per call")]
    assert title == f"MiB allocated per call, {MODE_LABELS[FRESH_GRAD]}:"
    fresh = [r for r in document["rows"] if r["mode"] == FRESH_GRAD]
    assert [row[0] for row in allocated[1:]] == [r["op"] for r in fresh]
    for row, record in zip(allocated[1:], fresh):
        assert row[3] == report._mib(record["allocated_bytes"])
        assert row[5] == report._mib(record["peers"]["eager"]["allocated_bytes"])
    assert document["summary"] in text


def test_markdown_out_writes_the_same_text_and_the_default_json(bench_run, capsys, tmp_path):
    out, _ = bench_run
    printed = render(capsys, "--out", str(out), "--markdown")  # OUT/bench.json
    target = tmp_path / "tables" / "bench.md"
    said = render(capsys, "--markdown", str(out / "bench.json"), "--markdown-out", str(target))
    assert said.strip() == f"wrote {target}"
    assert target.read_text() == printed
    # --markdown-out alone reads OUT/bench.json too.
    render(capsys, "--out", str(out), "--markdown-out", str(target))
    assert target.read_text() == printed


def test_missing_fields_print_a_dash(bench_run, capsys, tmp_path):
    _, document = bench_run
    document = copy.deepcopy(document)
    for field in ("date", "cpu_model", "load_average_at_start"):
        del document["environment"][field]
    row = document["rows"][0]
    for field in ("gbps", "roofline_fraction", "copy_time", "max_abs_err"):
        del row[field]
    del row["peers"]["native"]
    del row["time"]["iqr_s"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(document))
    text = render(capsys, "--markdown", str(path))
    header = text.split("\n")[0]
    assert "date -" in header and "CPU - (" in header and "load average - at" in header
    key = [row["op"], row["dtype"], row["shape"], MODE_LABELS[row["mode"]]]
    [shown] = [r for _, rows in tables(text) for r in rows[1:] if r[:4] == key]
    shown_by = dict(zip(OPS_COLUMNS, shown))
    for column in ("+-", "vs native", "GB/s", "copy%", "max err"):
        assert shown_by[column] == "-", column
    assert shown_by["time"] == report._time(row["time"]["median_s"])


def _batch(batch: int, ms: float, peak) -> dict:
    step = ms / 1e3
    read = 12_345_678 * batch
    gb_s = read / step / 1e9
    return {
        "batch": batch,
        "prefill_s": 0.02,
        "generate_s": 0.5,
        "ms_per_token": ms,
        "tokens_per_s": batch / step,
        "bytes_read_per_step": read,
        "gb_per_s": gb_s,
        "percent_of_copy": 100 * gb_s / 20.0,
        "percent_of_read": 100 * gb_s / 25.0,
        "peak_bytes": peak,
    }


DECODE_SIZE = {
    "size": "tiny",
    "config": {
        "hidden": 64,
        "layers": 2,
        "heads": 4,
        "kv_heads": 2,
        "intermediate": 128,
        "vocab": 256,
    },
    "parameters": 123_456,
    "rows": [
        {
            "variant": "HF bf16",
            "weights_bytes": 3 << 20,
            "batches": [_batch(1, 1.234, 5 << 20), _batch(8, 4.5, None)],
        },
        {
            "variant": "fuseops w8a16",
            "weights_bytes": 1 << 20,
            # Timing noise can leave no decode time: no tokens/s, GB/s or % of copy.
            "batches": [
                dict(_batch(1, -0.25, 1 << 20), tokens_per_s=None, gb_per_s=None),
                _batch(8, 0.75, 2 << 20),
            ],
        },
        {"variant": "fuseops w4a16", "error": "RuntimeError: no | kernel"},
    ],
}


def decode_document() -> dict:
    """As decode.run() writes decode.json."""
    return {
        "environment": {
            "fuseops_version": "0.1.0",
            "torch_version": "2.13.0+cpu",
            "transformers_version": "5.0.0",
            "cpu_model": "Test CPU 9000",
            "logical_cpus": 2,
            "threads": 1,
            "omp_wait_policy": "PASSIVE",
            "load_average_at_start": 3.26,
            "fuseops_cpu_capability": "AVX512",
            "date": "2026-01-02T03:04:05+00:00",
        },
        "prompt_tokens": 8,
        "new_tokens": 4,
        "repeats": 1,
        "batches": [1, 8],
        "copy_gb_per_s": 20.0,
        "read_gb_per_s": 25.0,
        "method": {"timing": "t", "bytes_read": "b", "copy": "c", "read": "r", "peak_memory": "p"},
        "results": [DECODE_SIZE],
        "llama_cpp": "llama.cpp anchor (BF16/Q8_0/Q4_0) skipped: not installed",
    }


def test_decode_json_as_markdown(capsys, tmp_path):
    document = decode_document()
    document["results"][0]["rows"][1]["batches"][0]["percent_of_copy"] = None
    document["results"][0]["rows"][1]["batches"][0]["percent_of_read"] = None
    path = tmp_path / "decode.json"
    path.write_text(json.dumps(document))
    text = render(capsys, "--markdown", str(path))
    header = text.split("\n")[0]
    for part in (
        "fuseops 0.1.0",
        "torch 2.13.0+cpu",
        "CPU Test CPU 9000 (2 logical CPUs)",
        "ISA fuseops AVX512",
        "1 threads",
        "date 2026-01-02T03:04:05+00:00",
        "load average 3.3 at the start",
        "copy 20.0 GB/s",
        "read 25.0 GB/s",
    ):
        assert part in header, part

    [(title, rows)] = tables(text)
    assert title.startswith("#### size tiny: LlamaForCausalLM, hidden 64, 2 layers")
    assert "0.1M parameters; prompt 8, 4 new tokens" in title
    assert rows[0] == decode.TABLE_COLUMNS
    # Every variant and batch once; the failed variant on one line.
    assert [tuple(row[:2]) for row in rows[1:]] == [
        ("HF bf16", "1"),
        ("HF bf16", "8"),
        ("fuseops w8a16", "1"),
        ("fuseops w8a16", "8"),
        ("fuseops w4a16", "ERROR: RuntimeError: no \\| kernel"),
    ]
    assert rows[-1][2:] == ["-"] * 8
    # The decode run's own table formats each figure alike.
    args = argparse.Namespace(decode_prompt=8, decode_new_tokens=4, decode_repeats=1)
    text_rows = [
        cells(line)
        for line in decode.table(DECODE_SIZE, args).split("\n")
        if line.startswith("| ") and not line.startswith(("| variant", "| ---"))
    ]
    assert rows[1:-1] == text_rows[:-1]
    first = dict(zip(decode.TABLE_COLUMNS, rows[1]))
    source = DECODE_SIZE["rows"][0]["batches"][0]
    assert first["ms/token"] == "1.23" and first["MB read/step"] == "12.35"
    assert first["tokens/s"] == f"{source['tokens_per_s']:.1f}"
    assert first["% of copy"] == f"{source['percent_of_copy']:.0f}"
    assert first["% of read"] == f"{source['percent_of_read']:.0f}"
    assert first["weights MiB"] == "3.0" and first["peak MiB"] == "5.0"
    assert rows[2][-1] == "-"  # no peak recorded
    # No tokens/s, GB/s, % of copy or % of read.
    assert rows[3][3:8] == ["-", "12.35", "-", "-", "-"]
    assert text.rstrip().endswith(document["llama_cpp"])

    # Under the table, one tokens/s chart per batch size, of the variants
    # with a figure there (w8a16 has none at batch 1, w4a16 failed).
    charts = re.findall(r"```mermaid\n(.*?)```", text, re.S)
    assert [chart.split("\n")[0] for chart in charts] == ["xychart-beta horizontal"] * 2
    one, eight = (
        dict(line.strip().split(" ", 1) for line in c.strip().split("\n")[1:]) for c in charts
    )
    assert one["title"] == '"size tiny, batch 1: tokens/s"'
    assert one["x-axis"] == '["HF bf16"]'
    assert one["bar"] == f"[{1 / 1.234e-3:.1f}]"
    assert eight["x-axis"] == '["HF bf16", "fuseops w8a16"]'
    assert eight["bar"] == f"[{8 / 4.5e-3:.1f}, {8 / 0.75e-3:.1f}]"
    assert eight["y-axis"] == f'"tokens/s" 0 --> {int(8 / 0.75e-3 * 1.1 + 1)}'
    assert text.index("```mermaid") > text.index("| fuseops w4a16 |")


def test_unreadable_or_foreign_json_is_refused(capsys, tmp_path):
    missing = tmp_path / "none.json"
    assert main(["bench", "--markdown", str(missing)]) == 2
    assert "none.json" in capsys.readouterr().err
    other = tmp_path / "transformers.json"
    other.write_text(json.dumps({"preset": "small", "results": [{"dtype": "float32"}]}))
    assert main(["bench", "--markdown", str(other)]) == 2
    assert "neither the JSON" in capsys.readouterr().err
    with pytest.raises(ValueError):
        markdown.render([1, 2])
