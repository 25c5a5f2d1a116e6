"""`python -m fuseops bench`: runs end to end, writes valid outputs, and never
passes a wrong or missing op. Tiny sizes; timings are never asserted."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math

import pytest
import torch

import fuseops
from fuseops import bench
from fuseops.__main__ import main
from fuseops.bench import calls, cases, correctness, environment, report, results, runner, timing

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
QUICK = ["--shapes", "32x160", "--min-time", "0.005", "--no-progress"]


@dataclasses.dataclass(frozen=True)
class _ShortBlocks(timing.TimerSettings):
    block_time: float = 0.001


@pytest.fixture(autouse=True)
def _short_blocks(monkeypatch):
    """The runs in this process time in blocks of 1 ms instead of 5. Every
    peer of every row still takes min_blocks (7) blocks, calibrated, in
    turns, by the same code; only their length changes, and the tests never
    assert a timing: most of the time of the runs over every op was spent
    inside the timed blocks."""
    monkeypatch.setattr(timing, "TimerSettings", _ShortBlocks)


def _bench(tmp_path, *extra: str) -> int:
    return main(["bench", "--out", str(tmp_path), *QUICK, *extra])


def _rows(tmp_path) -> list[dict]:
    return json.loads((tmp_path / "bench.json").read_text())["rows"]


def _run_cases(tmp_path, case_list, *extra: str) -> int:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--out", str(tmp_path), *QUICK, *extra])
    return bench.run(args, case_list=case_list)


def test_relu_end_to_end_writes_table_json_csv_chart_and_trace(tmp_path, capsys):
    assert (
        _bench(
            tmp_path,
            "--preset",
            "standard",
            "--ops",
            "relu",
            "--dtype",
            "float32,bfloat16",
            "--profile",
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "vs compile" in printed and "relu" in printed
    assert f"wrote table {tmp_path / 'bench.txt'}" in printed

    document = json.loads((tmp_path / "bench.json").read_text())
    assert document["environment"]["threads"] == torch.get_num_threads()
    assert document["environment"]["fuseops_cpu_capability"]
    method = document["environment"]["method"]
    assert method["timing"] == timing.TIMING_METHOD
    assert method["peak_memory"] == timing.PEAK_MEMORY_METHOD
    assert set(method) == {
        "timing",
        "peak_memory",
        "allocated_bytes",
        "fresh_grad",
        "tolerance",
        "bytes_moved",
        "roofline",
    }
    assert all(method.values())
    rows = document["rows"]
    assert {(r["dtype"], r["mode"]) for r in rows} == {
        (d, m) for d in ("float32", "bfloat16") for m in ("forward", "forward+backward", "out")
    }
    for row in rows:
        assert row["status"] == "ok", row
        assert row["time"]["median_s"] > 0 and row["time"]["samples"] >= 7
        assert row["gbps"] > 0 and row["roofline_fraction"] > 0
        assert row["peak_bytes"] is not None
        assert row["max_abs_err"] is not None and row["error_ratio"] <= 1
        assert set(row["peers"]) == {"eager", "compiled", "native"}
        for peer in row["peers"].values():
            assert peer["error"] == "" and peer["speedup"] > 0
    out_rows = [r for r in rows if r["mode"] == "out"]
    assert all(r["peers"]["native"]["variant"] == "out=" for r in out_rows)
    assert all(r["peers"]["eager"]["variant"] == "allocating" for r in out_rows)
    # An allocating float32 forward of 32x160 allocates its 20 KiB output.
    forward = next(r for r in rows if r["mode"] == "forward" and r["dtype"] == "float32")
    assert forward["peak_bytes"] >= 32 * 160 * 4
    assert forward["bytes_moved"] == 2 * 32 * 160 * 4

    with open(tmp_path / "bench.csv", newline="") as f:
        records = list(csv.DictReader(f))
    assert len(records) == len(rows)
    assert all(float(r["compiled_speedup"]) > 0 for r in records)

    assert (tmp_path / "speedup.png").read_bytes().startswith(PNG_SIGNATURE)
    trace = json.loads((tmp_path / "profile" / "relu-float32-32x160-forward.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert "fuseops::relu" in names
    assert "relu forward [fuseops]" in names
    assert "fuseops::relu_backward" in {
        e.get("name")
        for e in json.loads(
            (tmp_path / "profile" / "relu-float32-32x160-forward_backward.json").read_text()
        )["traceEvents"]
    }


def _wrong_relu(x, *, out=None):
    result = torch.relu(x) + 0.01
    if out is not None:
        out.copy_(result)
        return out
    return result


def test_a_wrong_implementation_is_marked_failed(tmp_path, capsys):
    wrong = dataclasses.replace(cases.by_name(["relu"])[0], name="wrong_relu", fuseops=_wrong_relu)
    assert (
        _run_cases(tmp_path, [wrong], "--preset", "standard", "--no-compile", "--dtype", "float32")
        == 1
    )
    printed = capsys.readouterr().out
    assert "!! FAILED: wrong_relu float32 32x160 fwd: MISMATCH vs reference" in printed
    assert "the peers' errors: eager reference 0, torch.relu 0" in printed
    rows = _rows(tmp_path)
    assert [r["status"] for r in rows] == ["FAILED"] * 3
    assert all(r["time"] is None and r["error_ratio"] > 1 for r in rows)


def test_a_raising_implementation_is_marked_error(tmp_path, capsys):
    def broken(x, *, out=None):
        raise RuntimeError("kernel exploded")

    case = dataclasses.replace(cases.by_name(["relu"])[0], name="broken", fuseops=broken)
    assert (
        _run_cases(tmp_path, [case], "--no-compile", "--dtype", "float32", "--modes", "forward")
        == 1
    )
    assert "kernel exploded" in capsys.readouterr().out
    assert [r["status"] for r in _rows(tmp_path)] == ["ERROR"]


def test_an_op_missing_from_the_build_is_listed_not_built(tmp_path, capsys):
    missing = dataclasses.replace(cases.by_name(["relu"])[0], name="teleport", fuseops="teleport")
    relu = cases.by_name(["relu"])[0]
    assert (
        _run_cases(
            tmp_path, [missing, relu], "--no-compile", "--dtype", "float32", "--modes", "forward"
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "not built: teleport (fuseops.teleport is not in the installed fuseops)" in printed
    assert "ops not built: 1" in printed
    document = json.loads((tmp_path / "bench.json").read_text())
    assert document["not_built"] == ["teleport"]
    assert [r["status"] for r in document["rows"]] == ["not built", "ok"]


def test_every_registered_op_is_timed_or_listed_not_built(tmp_path):
    # Forward only, no compile: every entry of the registry, as installed now.
    assert (
        _bench(
            tmp_path,
            "--ops",
            ",".join(case.name for case in cases.CASES),
            "--dtype",
            "float32",
            "--no-compile",
            "--modes",
            "forward,out",
            "--no-plot",
        )
        == 0
    )
    rows = _rows(tmp_path)
    assert {r["op"] for r in rows} == {case.name for case in cases.CASES}
    for row in rows:
        # A case's fuseops function: an attribute name, or the function itself
        # (an integration's, such as fuseops.trl's).
        fn = cases.by_name([row["op"]])[0].fuseops
        built = callable(fn) or hasattr(fuseops, fn)
        assert row["status"] == ("ok" if built else "not built"), row


def test_standard_preset_leaves_out_variants_and_full_includes_them():
    standard = {case.name for case in cases.by_name(variants=False)}
    assert "gelu_tanh" not in standard and "swiglu_packed" not in standard
    assert "gelu" in standard
    assert {case.name for case in cases.by_name()} == {case.name for case in cases.CASES}


def test_quick_preset_takes_one_case_per_op_family():
    from fuseops import ops

    families = [module.__name__.rsplit(".", 1)[-1] for module in ops.MODULES]
    chosen = cases.one_per_family()
    assert [case.family for case in chosen] == families
    assert not any(case.variant for case in chosen)
    # Each is its family's first case that is not a variant.
    for case in chosen:
        first = next(c for c in cases.CASES if c.family == case.family and not c.variant)
        assert case is first
    assert "rms_norm" in {c.name for c in chosen} and "gelu_tanh" not in {c.name for c in chosen}


def test_quick_preset_runs_one_row_per_op_family_and_dtype(tmp_path, capsys):
    """The default run: a row per family and dtype, forward+backward where
    the op has a backward, else forward; it points to the longer runs."""
    assert _bench(tmp_path, "--no-compile", "--no-plot") == 0
    printed = capsys.readouterr().out
    assert "preset quick" in printed
    assert (
        "longer runs: python -m fuseops bench --preset standard; python -m fuseops bench --full"
    ) in printed
    rows = _rows(tmp_path)
    chosen = {case.name: case for case in cases.one_per_family()}
    assert [(r["op"], r["dtype"]) for r in rows] == [
        (name, dtype) for name in chosen for dtype in ("float32", "bfloat16")
    ]
    for row in rows:
        case = chosen[row["op"]]
        assert row["family"] == case.family and row["status"] == "ok", row
        assert row["mode"] == ("forward+backward" if case.differentiable else "forward"), row
    assert json.loads((tmp_path / "bench.json").read_text())["environment"]["preset"] == "quick"


def test_full_flag_is_the_full_preset(tmp_path, capsys):
    assert _bench(tmp_path, "--full", "--preset", "quick", "--ops", "relu") == 2
    assert "--full is --preset full" in capsys.readouterr().err


def test_cuda_without_a_gpu_says_so_and_fails(tmp_path, capsys):
    if torch.cuda.is_available():
        assert environment.check_device(torch.device("cuda")) in (
            None,
            "this fuseops was built without CUDA kernels (see python -m fuseops info)",
        )
        return
    assert _bench(tmp_path, "--device", "cuda", "--ops", "relu") == 2
    assert "no CUDA" in capsys.readouterr().err


def test_bad_arguments_are_rejected(tmp_path, capsys):
    assert _bench(tmp_path, "--ops", "nope") == 2
    assert "unknown op(s) nope" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--shapes", "12by4"])
    with pytest.raises(SystemExit):
        main(["bench", "--dtype", "int8"])


def test_registry_entries_are_well_formed():
    names = [case.name for case in cases.CASES]
    assert len(names) == len(set(names))
    assert {
        "relu",
        "rms_norm",
        "fused_add_rms_norm",
        "layer_norm",
        "gelu",
        "silu",
        "bias_gelu",
        "swiglu",
        "geglu",
    } <= set(names)
    gen = torch.Generator().manual_seed(0)
    for case in cases.CASES:
        inputs = case.make_inputs(3, 8, torch.float32, torch.device("cpu"), gen)
        assert all(isinstance(t, torch.Tensor) for t in inputs)
        assert all(0 <= i < len(inputs) for i in case.differentiable)
        assert case.forward_traffic.bytes(3, 8, 4) > 0
        if case.differentiable:
            assert case.backward_traffic.bytes(3, 8, 4) > 0
        if case.native is not None:
            assert isinstance(case.native(*inputs, **case.options), (torch.Tensor, tuple))


def test_cases_with_their_own_shapes_and_no_backward():
    """A case's own shapes replace a preset's (explicit shapes apply to every
    case), and an inference case (nothing differentiable) has no
    forward+backward rows."""
    case = next(c for c in cases.CASES if c.name == "int8_weight_only_linear")
    config = runner.Config(cases=[case], dtypes=[torch.float32], shapes=[(4, 64)], preset="quick")
    preset_run = runner.Runner(config)
    assert preset_run.shapes(case) == case.shapes["quick"]
    assert preset_run.modes(case) == ["forward"]
    assert preset_run.row_count() == len(case.shapes["quick"]) == 1
    standard = runner.Runner(dataclasses.replace(config, preset="standard"))
    assert [m for m, _ in standard.shapes(case)] == [1, 8, 32, 256]
    explicit = runner.Runner(runner.Config(cases=[case], dtypes=[torch.float32], shapes=[(4, 64)]))
    assert explicit.shapes(case) == [(4, 64)]


def test_tolerance_check():
    want = (torch.tensor([1.0, -2.0, 0.0], dtype=torch.float64),)
    close = (torch.tensor([1.0 + 5e-5, -2.0, 1e-6]),)
    assert correctness.compare(close, want, torch.float32)[1] <= 1
    far = (torch.tensor([1.01, -2.0, 0.0]),)
    err, ratio = correctness.compare(far, want, torch.float32)
    assert err == pytest.approx(0.01, rel=1e-3) and ratio > 1
    nan = (torch.tensor([float("nan"), -2.0, 0.0]),)
    assert correctness.compare(nan, want, torch.float32) == (math.inf, math.inf)
    with pytest.raises(AssertionError):
        correctness.compare((torch.zeros(2),), want, torch.float32)


def test_timer_and_peak_memory():
    settings = timing.TimerSettings(min_time=0.001, min_blocks=5, block_time=0.0005)
    result = timing.measure(lambda: torch.ones(100).sum(), torch.device("cpu"), settings)
    assert result.median_s > 0 and result.samples >= 5 and result.calls >= result.samples
    peak = timing.peak_memory(lambda: torch.empty(1 << 20, dtype=torch.uint8), torch.device("cpu"))
    assert peak >= 1 << 20
    assert timing.peak_memory(lambda: None, torch.device("cpu")) == 0


def test_timer_calls_every_input_set_before_timing(monkeypatch):
    # A peer makes its own form of a set's weight on its first call of that
    # set: every set must have been called once before calibration starts.
    counts = [0] * 9
    seen_at_calibration = []

    def call_of(index):
        def call():
            counts[index] += 1

        return call

    rotation = calls._Rotation([call_of(i) for i in range(len(counts))])
    calibrate = timing._calibrate

    def recording(run_block, fn, settings):
        seen_at_calibration.append(list(counts))
        return calibrate(run_block, fn, settings)

    monkeypatch.setattr(timing, "_calibrate", recording)
    settings = timing.TimerSettings(min_time=0.001, min_blocks=3, block_time=0.0002)
    timing.measure(rotation, torch.device("cpu"), settings)
    [before] = seen_at_calibration
    assert min(before) >= 1, before


def test_tune_memory_flag_applies_to_every_peer_and_is_reported(tmp_path):
    # tune_memory() is process-wide: the bench runs in a child process.
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fuseops",
            "bench",
            "--out",
            str(tmp_path),
            *QUICK,
            "--ops",
            "relu",
            "--dtype",
            "float32",
            "--modes",
            "forward",
            "--no-compile",
            "--no-plot",
            "--tune-memory",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "memory: fuseops.cpu.tune_memory(keep_bytes=" in result.stdout
    memory = json.loads((tmp_path / "bench.json").read_text())["environment"]["memory_settings"]
    assert memory["keep_bytes"] > 0 and memory["output_cache_limit"] == memory["keep_bytes"]


def test_default_memory_settings_are_reported(tmp_path, capsys):
    assert (
        _bench(
            tmp_path,
            "--ops",
            "relu",
            "--dtype",
            "float32",
            "--modes",
            "forward",
            "--no-compile",
            "--no-plot",
        )
        == 0
    )
    assert "memory: process defaults" in capsys.readouterr().out
    assert (
        json.loads((tmp_path / "bench.json").read_text())["environment"]["memory_settings"] is None
    )


# --- fwd+bwd fresh grad: the upstream gradient handed over as training does ---

FRESH = results.FRESH_GRAD


def test_fresh_grad_mode_shows_the_gradient_reuse(tmp_path, capsys):
    """relu's backward writes its gradient over a sole-owner upstream
    gradient: in the fresh grad row fuseops allocates at least one gradient
    fewer than in the fwd+bwd row, where the caller holds the gradient, and
    fewer than its peers, which are handed the same gradient. torch.compile
    is a peer here as well."""
    assert (
        _bench(
            tmp_path,
            "--ops",
            "relu",
            "--dtype",
            "float32",
            "--modes",
            "forward+backward,train",
            "--no-plot",
        )
        == 0
    )
    printed = capsys.readouterr().out
    rows = {r["mode"]: r for r in _rows(tmp_path)}
    assert set(rows) == {"forward+backward", FRESH}
    held, fresh = rows["forward+backward"], rows[FRESH]
    gradient = 32 * 160 * 4
    for row in (held, fresh):
        assert row["status"] == "ok" and row["error_ratio"] <= 1, row
        assert row["bytes_moved"] == held["bytes_moved"]
        assert set(row["peers"]) == {"eager", "compiled", "native"}
        for peer in row["peers"].values():
            assert peer["error"] == "" and peer["allocated_bytes"] >= gradient, peer
    # The fresh grad call also allocates the hand-over's scalar loss and
    # its gradient: a few bytes.
    scalars = 64
    assert fresh["allocated_bytes"] <= held["allocated_bytes"] - gradient + scalars
    for peer in fresh["peers"].values():
        assert fresh["allocated_bytes"] <= peer["allocated_bytes"] - gradient, peer
    # The forward's output is still allocated.
    assert fresh["allocated_bytes"] >= gradient

    lines = printed.splitlines()
    start = lines.index("MiB allocated per call, fwd+bwd fresh grad:")
    assert lines[start + 1].split()[3:5] == ["fuseops", "held"]
    cells = lines[start + 3].split()
    assert cells[:5] == [
        "relu",
        "float32",
        "32x160",
        report._mib(fresh["allocated_bytes"]),
        report._mib(held["allocated_bytes"]),
    ]
    with open(tmp_path / "bench.csv", newline="") as f:
        records = {r["mode"]: r for r in csv.DictReader(f)}
    assert int(records[FRESH]["allocated_bytes"]) == fresh["allocated_bytes"]
    assert (
        int(records[FRESH]["eager_allocated_bytes"]) == (fresh["peers"]["eager"]["allocated_bytes"])
    )


def test_fresh_grad_call_hands_over_a_gradient_nothing_else_holds():
    """The call's upstream gradient is the set's waiting copy, which the
    fuseops backward then writes its result into; the set's own gradient is
    left as it was, and refill makes a new copy."""
    case = cases.by_name(["relu"])[0]
    [inputs] = calls.make_sets(case, torch.float32, (8, 32), torch.device("cpu"), 1, seed=0)
    inputs.grad_outputs = (torch.randn(8, 32),)
    kept = inputs.grad_outputs[0].clone()
    inputs.refill_fresh_grads()
    address = inputs.fresh_grads[0].data_ptr()
    call = calls.fresh_grad_call(fuseops.relu, case, inputs)
    output, grad = call()
    assert inputs.fresh_grads is None
    assert grad.data_ptr() == address
    x = inputs.args[0]
    torch.testing.assert_close(grad, kept * (x > 0), rtol=0, atol=0)
    torch.testing.assert_close(output, torch.relu(x), rtol=0, atol=0)
    assert torch.equal(inputs.grad_outputs[0], kept)
    with pytest.raises(RuntimeError, match="handed over already"):
        call()
    call.refill()
    assert torch.equal(inputs.fresh_grads[0], kept)
    # The held-gradient call never takes the gradient over.
    held = calls.backward_call(fuseops.relu, case, inputs)()[1]
    assert held.data_ptr() != inputs.grad_outputs[0].data_ptr()


def test_fresh_grad_rows_of_multi_output_and_inference_ops(tmp_path):
    """Ops with several outputs (fused_add_rms_norm: out and new residual;
    rope: q and k) or several differentiable inputs (swiglu), and a loss
    (cross_entropy, a scalar output and integer targets), are checked
    against the reference and timed; an inference op has no such row."""
    ops = ["swiglu", "fused_add_rms_norm", "rope", "cross_entropy", "int8_weight_only_linear"]
    assert (
        _bench(
            tmp_path,
            "--ops",
            ",".join(ops),
            "--dtype",
            "float32",
            "--no-compile",
            "--modes",
            "fresh-grad",
            "--no-plot",
        )
        == 0
    )
    rows = _rows(tmp_path)
    assert [r["op"] for r in rows] == ops[:-1]
    for row in rows:
        assert row["mode"] == FRESH and row["status"] == "ok", row
        assert row["error_ratio"] <= 1 and row["allocated_bytes"] is not None
        assert row["peers"]["eager"]["allocated_bytes"] is not None


def test_a_wrong_gradient_fails_the_fresh_grad_row(tmp_path, capsys):
    class WrongBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.relu(x)

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * (x > 0) * 1.01

    wrong = dataclasses.replace(
        cases.by_name(["relu"])[0], name="wrong_relu_grad", fuseops=lambda x: WrongBackward.apply(x)
    )
    assert (
        _run_cases(tmp_path, [wrong], "--no-compile", "--dtype", "float32", "--modes", "fresh-grad")
        == 1
    )
    assert "!! FAILED: wrong_relu_grad float32 32x160 fwd+bwd fresh grad: MISMATCH" in (
        capsys.readouterr().out
    )


def test_modes_parse_and_default():
    assert bench.parse_modes("train,forward") == ["forward", FRESH]
    assert bench.parse_modes("fresh-grad") == bench.parse_modes(FRESH) == [FRESH]
    with pytest.raises(argparse.ArgumentTypeError, match="fresh-grad"):
        bench.parse_modes("sideways")
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert parser.parse_args([]).modes is None  # the preset's
    assert bench.PRESETS["standard"].modes == bench.PRESETS["full"].modes == (results.DEFAULT_MODES)
    assert FRESH not in results.DEFAULT_MODES


def test_a_consuming_call_is_timed_without_its_refill():
    """A call whose input is prepared again after it (refill) is timed call
    by call, the refill outside the timed region, after every call."""
    import time

    counts = {"calls": 0, "refills": 0}

    def call():
        counts["calls"] += 1
        assert counts["calls"] == counts["refills"] + 1, "called before its refill"

    def refill():
        counts["refills"] += 1
        time.sleep(0.002)

    call.refill = refill
    settings = timing.TimerSettings(min_time=0.001, min_blocks=3, block_time=0.0005)
    result = timing.measure(call, torch.device("cpu"), settings)
    assert result.median_s < 0.001 and result.samples >= 3
    assert counts["calls"] == counts["refills"] >= result.calls
    use = timing.memory_use(call, torch.device("cpu"))
    assert counts["calls"] == counts["refills"] and use.peak == use.allocated == 0
    use = timing.memory_use(
        lambda: (torch.empty(1 << 20, dtype=torch.uint8), torch.empty(1 << 20, dtype=torch.uint8)),
        torch.device("cpu"),
    )
    assert use.allocated >= 2 << 20 and use.peak >= 2 << 20


def test_allocation_table_formats_savings_either_way():
    def row(mode, fuseops_bytes, eager_bytes):
        result = results.Row(
            op="op", dtype="float32", shape="4x4", mode=mode, allocated_bytes=fuseops_bytes
        )
        result.peers["eager"] = results.PeerResult(label="eager", allocated_bytes=eager_bytes)
        return result

    lines = report.allocation_table(
        [row("forward+backward", 300 << 20, 100 << 20), row(FRESH, 200 << 20, 100 << 20)]
    )
    assert lines[4].split() == [
        "op",
        "float32",
        "4x4",
        "200",
        "300",
        "100",
        "-",
        "-",
        "100",
        "-100",
        "-",
    ]
    assert report.allocation_table([row("forward+backward", 1, 1)]) == []


def test_rows_below_the_floor_are_marked_and_listed(tmp_path):
    """The floor: a row slower than eager or native (the faster of the two)
    is marked in its ratio cell, listed under the table, counted in the
    summary and recorded in the JSON; a row at or above both is not, nor
    is a row slower only than torch.compile (not a path it replaces)."""

    def row(op, **peer_seconds):
        result = results.Row(op=op, dtype="float32", shape="4x4", mode="forward")
        result.time = timing.Timing(median_s=1.0, iqr_s=0.0, samples=7, calls=1)
        for name, seconds in peer_seconds.items():
            result.peers[name] = results.PeerResult(
                label=name, time=timing.Timing(median_s=seconds, iqr_s=0.0, samples=7, calls=1)
            )
        return result

    rows = [
        row("fast", eager=2.0, native=1.5, compiled=0.5),
        row("slow_native", eager=3.0, native=0.8),
        row("slow_eager", eager=0.9),
    ]
    assert [report.floor_ratio(r) for r in rows] == [1.5, 0.8, 0.9]
    assert [r.op for r in report.below_floor(rows)] == ["slow_native", "slow_eager"]
    assert report.ratio_cell(0.8, "native") == "0.80x!"
    assert report.ratio_cell(0.5, "compiled") == "0.50x"
    assert report.ratio_cell(1.0, "eager") == "1.00x"
    env = environment.environment(runner.Config(cases=[], dtypes=[], shapes=[]))
    text = report.table(rows, env)
    assert "2 below the floor" in text
    listed = text.split("below the floor (the slower of eager and native / fuseops):")[1]
    assert "slow_native float32 4x4 fwd: 0.80x" in listed
    assert "slow_eager float32 4x4 fwd: 0.90x" in listed and "fast" not in listed
    assert "0.80x!" in text and "0.50x!" not in text
    path = tmp_path / "bench.json"
    report.write_json(str(path), rows, env)
    recorded = json.loads(path.read_text())["below_floor"]
    assert [(r["op"], r["floor_ratio"]) for r in recorded] == [
        ("slow_native", 0.8),
        ("slow_eager", 0.9),
    ]


# --- progress: a bar on a terminal, plain lines in a log ---


def test_progress_in_a_log_is_one_plain_line_per_finished_row(tmp_path):
    """With stdout and stderr piped (a log), no bar frames (carriage
    returns) are written: one line per row, as each finishes."""
    import re
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fuseops",
            "bench",
            "--out",
            str(tmp_path),
            "--preset",
            "standard",
            "--ops",
            "relu",
            "--dtype",
            "float32",
            "--shapes",
            "32x160",
            "--min-time",
            "0.005",
            "--no-compile",
            "--no-plot",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stdout and "\r" not in result.stderr
    progress = [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == 3, result.stderr
    for index, (line, mode) in enumerate(zip(progress, ("fwd", "fwd+bwd", "fwd out="))):
        assert re.fullmatch(
            rf"\[{index + 1}/3\] relu float32 32x160 {re.escape(mode)}: "
            r"\S+ \S?s \(vs eager \S+x!?, vs native \S+x!?\), ok",
            line,
        ), line


class _Terminal:
    def __init__(self):
        self.written = []

    def isatty(self):
        return True

    def write(self, text):
        self.written.append(text)

    def flush(self):
        pass


def test_progress_on_a_terminal_is_a_bar():
    pytest.importorskip("tqdm")
    terminal = _Terminal()
    progress = bench.Progress(2, enabled=True, stream=terminal)
    progress.start("relu float32 4x4 fwd")
    progress.finished(results.Row(op="relu", status="not built"))
    progress.close()
    assert progress.bar is not None
    assert any("\r" in text for text in terminal.written)
    assert not any(text.startswith("[1/2]") for text in terminal.written)


# --- the chart ---


def _png_size(path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header.startswith(PNG_SIGNATURE)
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


def _chart_rows(count: int, modes=("forward", "forward+backward", "out"), name="op") -> list:
    """`count` op/dtype/shape lines in `modes`, ratios spread over 0.3x-12x."""
    rows = []
    for i in range(count):
        for k, mode in enumerate(modes):
            row = results.Row(
                op=f"{name}_number_{i}_with_a_long_name",
                family=f"{name}{i // 4}",
                dtype="bfloat16",
                shape="16384x1024",
                mode=mode,
                time=timing.Timing(1e-3, 1e-5, 7, 7),
            )
            for j, peer in enumerate(results.PEERS):
                ratio = 0.3 * 40 ** (((i + k + j) % 10) / 9)
                row.peers[peer] = results.PeerResult(
                    label=peer, time=timing.Timing(ratio * 1e-3, 0, 7, 7)
                )
            rows.append(row)
    return rows


ENV = {"device": "cpu", "threads": 2, "cpu_model": "test CPU", "preset": "full"}


def test_chart_panels_group_lines_by_their_columns():
    """Lines with backward rows and forward-only lines (inference ops) get
    panels of their own columns; every line is in the panels once."""
    rows = _chart_rows(3) + _chart_rows(2, modes=("forward",), name="linear")
    panels, ratios = report.chart_panels(rows)
    assert [(len(chunk), len(columns)) for chunk, columns in panels] == [(3, 9), (2, 3)]
    assert len(ratios) == 3 * 9 + 2 * 3
    shown = [line for chunk, _ in panels for line in chunk]
    assert len(shown) == len(set(shown)) == 5
    assert {line for line, _ in ratios} == set(shown)
    first = rows[0]
    assert ratios[(first.family, first.op, first.dtype, first.shape), ("forward", "eager")] == (
        pytest.approx(first.speedup("eager"))
    )


def test_chart_stays_screen_sized(tmp_path):
    pytest.importorskip("matplotlib")
    # The quick preset's size: 22 lines.
    rows = _chart_rows(16, modes=("forward+backward",)) + _chart_rows(
        6, modes=("forward",), name="linear"
    )
    assert report.write_chart(str(tmp_path / "quick.png"), rows, ENV)
    width, height = _png_size(tmp_path / "quick.png")
    assert width < 1200 and height < 1000, (width, height)
    # The full preset's size: ~70 lines with backward rows, ~100 without.
    # They wrap into panels side by side no wider than MAX_WIDTH, each line
    # still CELL_HEIGHT tall.
    rows = _chart_rows(70) + _chart_rows(100, modes=("forward",), name="linear")
    panels, _ = report.chart_panels(rows)
    assert len(panels) >= 3
    assert report.write_chart(str(tmp_path / "full.png"), rows, ENV)
    width, height = _png_size(tmp_path / "full.png")
    assert width <= (report.MAX_WIDTH + 0.4) * report.DPI, width
    tallest = max(len(chunk) for chunk, _ in panels)
    assert height >= tallest * report.CELL_HEIGHT * report.DPI
