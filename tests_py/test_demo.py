"""`python -m fuseops demo`: the plain and the fuseops model train alike, the
command writes its summary and plot, and it says what it replaced."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

import fuseops
from fuseops import demo
from fuseops.__main__ import main

TINY = dict(steps=4, d_model=32, n_layers=1, n_heads=2, seq_len=16, batch_size=4, progress=False)


def test_two_runs_agree_for_a_few_steps():
    summary = demo.run_demo(demo.DemoSettings(**TINY))
    plain, with_fuseops = summary["runs"]["torch.nn"], summary["runs"]["fuseops"]
    assert len(plain["losses"]) == len(with_fuseops["losses"]) == TINY["steps"]
    # float32 training: the fused kernels round differently from torch's,
    # which over 4 steps of a 1-layer model moves the loss by far less than 1e-4.
    assert summary["loss_max_abs_diff"] < 1e-4
    # It learns: character-level loss starts near log(vocab) and goes down.
    assert plain["losses"][0] == pytest.approx(
        torch.log(torch.tensor(float(summary["data"]["vocab_size"]))).item(), rel=0.2
    )
    assert plain["losses"][-1] < plain["losses"][0]
    assert plain["peak_step_bytes"] > 0 and with_fuseops["peak_step_bytes"] > 0


def test_bfloat16_runs_agree_roughly():
    summary = demo.run_demo(demo.DemoSettings(**{**TINY, "steps": 3}, dtype="bfloat16"))
    # bfloat16 has 8 bits of mantissa: losses near 4 agree to a few 1e-2.
    assert summary["loss_max_abs_diff"] < 0.1


def test_fuseops_modules_replace_the_norms_and_mlps_it_has():
    config = demo.ModelConfig(vocab_size=10, d_model=16, n_layers=2, n_heads=2, seq_len=8)
    torch.manual_seed(0)
    plain = demo.TinyLlama(config)
    model = copy.deepcopy(plain)
    replaced = demo.use_fuseops(model)
    assert {r["name"] for r in replaced} == {
        "norm",
        "loss",
        "blocks.0.attn_norm",
        "blocks.0.attn.rotary",
        "blocks.0.mlp",
        "blocks.0.mlp_norm",
        "blocks.1.attn_norm",
        "blocks.1.attn.rotary",
        "blocks.1.mlp",
        "blocks.1.mlp_norm",
    }
    assert [r for r in replaced if r["name"].endswith(".mlp")] == [
        {"name": f"blocks.{i}.mlp", "old": "SwiGLUMLP", "new": "fuseops.nn.SwiGLU"}
        for i in range(2)
    ]
    assert all(type(block.mlp) is fuseops.nn.SwiGLU for block in model.blocks)
    assert all(type(block.attn.rotary) is fuseops.nn.RotaryEmbedding for block in model.blocks)
    assert type(model.loss) is fuseops.nn.LinearCrossEntropyLoss
    # Same parameters under the same names, so the same outputs.
    assert plain.state_dict().keys() == model.state_dict().keys()
    tokens = torch.randint(0, 10, (2, 8))
    torch.testing.assert_close(model(tokens), plain(tokens), rtol=1e-5, atol=1e-5)
    # The training loss goes through the fused LM head: same value, same
    # gradients (float32 sums in another order: a few ulp, far inside 1e-4).
    targets = torch.randint(0, 10, (2, 8))
    plain_loss, fused_loss = plain(tokens, targets), model(tokens, targets)
    torch.testing.assert_close(fused_loss, plain_loss, rtol=1e-5, atol=1e-6)
    plain_loss.backward()
    fused_loss.backward()
    for (name, p), q in zip(plain.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_summary_reports_what_the_fused_lm_head_saves():
    summary = demo.run_demo(demo.DemoSettings(**{**TINY, "steps": 3}))
    head = summary["lm_head"]
    assert head["logits_bytes"] == head["tokens"] * head["vocab_size"] * 4
    # The plain head keeps the float32 logits and their gradient; the fused
    # one forms neither beyond a chunk.
    assert head["peak_bytes"]["torch.nn"] >= head["logits_bytes"]
    assert head["peak_bytes"]["fuseops"] < head["peak_bytes"]["torch.nn"]
    assert "LM head alone" in demo.report(summary)


def test_report_says_when_nothing_was_replaced(monkeypatch):
    monkeypatch.setattr(fuseops.nn._replace, "_REPLACEMENTS", {})
    summary = demo.run_demo(demo.DemoSettings(**{**TINY, "steps": 3}))
    assert summary["replaced"] == []
    assert {k["type"] for k in summary["not_replaced"]} == {
        "RMSNorm",
        "SwiGLUMLP",
        "TorchRotaryEmbedding",
        "TorchLinearCrossEntropyLoss",
    }
    assert summary["loss_max_abs_diff"] == 0.0  # the very same computation
    text = demo.report(summary)
    assert "fuseops replaced NOTHING" in text
    assert "run-to-run noise, not fuseops" in text


def test_cli_writes_summary_and_plot(tmp_path, capsys):
    assert (
        main(
            [
                "demo",
                "--steps",
                "3",
                "--d-model",
                "32",
                "--layers",
                "1",
                "--heads",
                "2",
                "--seq-len",
                "16",
                "--batch-size",
                "2",
                "--no-progress",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "loss curves torch.nn vs fuseops: max |difference|" in printed
    summary = json.loads((tmp_path / "demo.json").read_text())
    assert set(summary["runs"]) == {"torch.nn", "fuseops"}
    assert summary["settings"]["steps"] == 3
    assert (tmp_path / "demo-loss.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_cli_rejects_heads_that_do_not_divide_the_width(tmp_path, capsys):
    assert main(["demo", "--d-model", "30", "--heads", "4", "--out", str(tmp_path)]) == 2
    assert "--heads" in capsys.readouterr().err


def test_cli_tune_memory_is_applied_and_reported(tmp_path):
    # tune_memory() is process-wide: the demo runs in a child process.
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fuseops",
            "demo",
            "--steps",
            "3",
            "--d-model",
            "32",
            "--layers",
            "1",
            "--heads",
            "2",
            "--seq-len",
            "16",
            "--batch-size",
            "2",
            "--no-progress",
            "--no-plot",
            "--tune-memory",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "memory: fuseops.cpu.tune_memory(keep_bytes=" in result.stdout
    summary = json.loads((tmp_path / "demo.json").read_text())
    assert summary["memory_settings"]["keep_bytes"] > 0
    assert summary["settings"]["tune_memory"] is True


def test_preset_sets_sizes_and_flags_override_it():
    import argparse

    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    large = demo.resolve_sizes(parser.parse_args(["--preset", "large"]))
    assert large["d_model"] >= 1024 and large["seq_len"] >= 512
    assert {k: large[k] for k in demo.PRESETS["large"]} == demo.PRESETS["large"]
    overridden = demo.resolve_sizes(parser.parse_args(["--preset", "large", "--d-model", "64"]))
    assert overridden["d_model"] == 64 and overridden["seq_len"] == large["seq_len"]
    defaults = demo.resolve_sizes(parser.parse_args([]))
    assert defaults["d_model"] == demo.DemoSettings().d_model


def test_cli_compare_tune_memory_reports_four_runs(tmp_path):
    # The tuned pair trains in a child process (the setting is process-wide).
    assert (
        main(
            [
                "demo",
                "--steps",
                "3",
                "--d-model",
                "32",
                "--layers",
                "1",
                "--heads",
                "2",
                "--seq-len",
                "16",
                "--batch-size",
                "2",
                "--no-progress",
                "--no-plot",
                "--compare-tune-memory",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    summary = json.loads((tmp_path / "demo.json").read_text())
    assert summary["memory_settings"] is None
    assert summary["memory_settings_tuned"]["keep_bytes"] > 0
    runs = summary["runs"]
    assert set(runs) == {"torch.nn", "fuseops", "torch.nn + tune_memory", "fuseops + tune_memory"}
    # Same seed, same batches, same kernels: the tuned runs' losses are the
    # untuned ones (memory settings change where tensors live, not values).
    assert runs["torch.nn + tune_memory"]["losses"] == runs["torch.nn"]["losses"]
    assert runs["fuseops + tune_memory"]["losses"] == runs["fuseops"]["losses"]
    assert runs["fuseops + tune_memory"]["other_process"] is True
    tuned = json.loads((tmp_path / "tuned" / "demo.json").read_text())
    assert tuned["settings"]["tune_memory"] is True


def test_cli_rejects_tune_memory_with_compare(tmp_path, capsys):
    assert main(["demo", "--tune-memory", "--compare-tune-memory", "--out", str(tmp_path)]) == 2
    assert "--compare-tune-memory" in capsys.readouterr().err


def test_quantized_inference_of_the_trained_model_in_every_mode():
    from fuseops.quantization import QUANTIZE_MODES

    summary = demo.run_demo(demo.DemoSettings(**{**TINY, "steps": 3}, quantized_eval_batches=2))
    rows = {row["mode"]: row for row in summary["quantized_inference"]}
    assert list(rows) == ["as trained", *QUANTIZE_MODES]
    trained = rows["as trained"]
    assert trained["layers_quantized"] == 0
    d, hidden = TINY["d_model"], demo.ModelConfig(vocab_size=1, d_model=TINY["d_model"]).ffn_hidden
    # One block: qkv [3d, d], out [d, d], gate and up [hidden, d], down [d, hidden], float32.
    dense_weights = 3 * d * d + d * d + 3 * hidden * d
    assert trained["linear_weight_bytes"] == 4 * dense_weights
    for mode, row in rows.items():
        if mode == "as trained":
            continue
        assert row["layers_quantized"] == 5, mode
        assert row["perplexity"] == pytest.approx(math.exp(row["loss"]))
        assert row["forward_seconds"] > 0
        if mode in ("w8a16", "w8a8"):
            # One int8 byte per weight plus a float32 scale per output
            # channel (and the packing's padding of channels to 16, none at
            # these sizes); W8A8 adds an int16 column sum per block of 32
            # inputs and output channel.
            shapes = [(3 * d, d), (d, d), (hidden, d), (hidden, d), (d, hidden)]
            colsums = 2 * sum(-(-k // 32) * n for n, k in shapes) if mode == "w8a8" else 0
            want = dense_weights + 4 * (5 * d + 2 * hidden) + colsums
            assert row["linear_weight_bytes"] == want, mode
            # Per-channel int8 weights are off by at most half a step
            # (absmax / 254) each: on a barely trained model (loss near
            # log(vocab) ~ 4.4) that moves the mean loss by far less than 0.02.
            assert row["loss"] == pytest.approx(trained["loss"], abs=0.02), mode
        elif mode in ("w4a16", "w4a8"):
            # The same buffers in both int4 modes, every layer at 4 bits (the
            # demo model has no head or value projection of its own, which
            # the "mixed" recipe would keep at 8). Half a byte per weight (K
            # padded to the group of 32, channels to blocks of 16) plus a
            # scale and zero point per group and channel.
            def int4_bytes(n, k):
                groups = -(-k // 32)
                # scale_zero in bfloat16 (Int4Linear's default): 2 bytes each.
                return (-(-n // 16) * 16) * groups * 32 // 2 + groups * 2 * n * 2

            shapes = [(3 * d, d), (d, d), (hidden, d), (hidden, d), (d, hidden)]
            assert row["linear_weight_bytes"] == sum(int4_bytes(n, k) for n, k in shapes)
            # int4 steps of a sixteenth of a group's range: the barely
            # trained model's loss (near log(vocab) ~ 4.4) moves by far less
            # than 0.1.
            assert row["loss"] == pytest.approx(trained["loss"], abs=0.1), mode
        else:
            # Half the values and a 1-bit mask per weight, plus a scale (and
            # for int8 activations a column sum) per channel: float32 values
            # 2.125 bytes per weight, int8 ones 0.625, plus at most 8/K
            # (K >= 32 here).
            per_weight = 2.125 if mode == "2:4" else 0.625
            assert row["linear_weight_bytes"] <= (per_weight + 0.25) * dense_weights, mode
            assert row["linear_weight_bytes"] > per_weight * dense_weights, mode
    report = demo.report(summary)
    assert "after fuseops.quantize_(model, mode)" in report
    assert all(f"\n{mode:<12}" in report for mode in QUANTIZE_MODES)


def test_progress_in_a_log_is_plain_lines(tmp_path, capsys):
    """stderr is not a terminal here (captured, as in a log): no bar frames
    (carriage returns), a line per tenth of the steps, each step once at most."""
    steps = 12
    assert (
        main(
            [
                "demo",
                "--steps",
                str(steps),
                "--d-model",
                "32",
                "--layers",
                "1",
                "--heads",
                "2",
                "--seq-len",
                "16",
                "--batch-size",
                "2",
                "--no-plot",
                "--quantized-eval-batches",
                "0",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if line.startswith("training step ")]
    every = math.ceil(steps / demo.PLAIN_PROGRESS_LINES)
    done = [*range(every, steps + 1, every)] + ([steps] if steps % every else [])
    assert [int(line.split()[2].split("/")[0]) for line in lines] == done
    assert all(line.split()[2].endswith(f"/{steps}:") for line in lines)
    assert all("loss torch.nn " in line and ", fuseops " in line for line in lines)
