"""Quantization judged on real pretrained models (fuseops.bench.real_models:
SmolLM2-135M-Instruct and Gemma 3 270M, from the package registry as the
real-models extra), not on random weights: each mode of
``fuseops.transformers.apply(model, quantize=...)`` with bfloat16
activations, scored on 1,024 tokens of real English text against the float32
model (perplexity, and the KL divergence of the next-token distributions),
and a greedy continuation that must not collapse.

The bounds are the measured deltas (PERFORMANCE.md, "Quantization on real
models", the same text and tokens) with room for the CPU builds' different
roundings, and they are the targets of the quantization work where it
meets them (on 512 tokens the same modes move by up to 0.4 points, so the
text is not shorter):
- bf16 and w8a16: perplexity within +0.5% (the target; measured -0.1% to
  +0.4%).
- w4a16 (the default "mixed" recipe: head and value projections at 8 bits,
  the rest int4 with a fitted scale and minimum per 32): within +10% (the
  target for models under 200M parameters; measured +0.6% and +6.7%).
- w8a8, activations quantized per block of 32: within +1% (the target;
  measured +0.43% and -0.04%, where one scale per token gave +5.8% and
  +2.5%).
- w4a8, activations quantized per weight group: within +10%, w4a16's
  bound (measured +1.19% and +6.73%, 0.6 and 0.1 points above w4a16: the
  target is within 2; one scale per token gave +4.2% and +9.0%).
- The old int4 default (symmetric, groups of 128, the head at 4 bits) is
  run too and must stay clearly worse than the recipe (measured +88% and
  +133%): the check that the scoring can tell a broken model from a good
  one.
Greedy: the quantized model's first 2 tokens are float's, and its 48 tokens
repeat themselves (the fraction of 4-grams seen before) at most 0.25 more
than float's own.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch

import fuseops
from fuseops.bench import real_models

missing = real_models.missing_requirements()
if missing is not None:
    pytest.skip(f"real models: {missing}", allow_module_level=True)

import fuseops.transformers as fot  # noqa: E402

TOKENS = 1024
NEW_TOKENS = 48
# Perplexity delta bounds, relative (module docstring).
BOUNDS = {"bf16": 0.005, "w8a16": 0.005, "w8a8": 0.01, "w4a16": 0.10, "w4a8": 0.10}


@pytest.fixture(scope="module", params=sorted(real_models.REAL_MODELS))
def reference(request):
    torch.manual_seed(0)
    model, tokenizer = real_models.load(request.param, torch.float32)
    ids = real_models.text_ids(tokenizer, TOKENS)
    log_probs = real_models.next_token_log_probs(model, ids)
    greedy = real_models.greedy(model, tokenizer, real_models.GREEDY_PROMPT, NEW_TOKENS)
    return {
        "name": request.param,
        "model": model,
        "tokenizer": tokenizer,
        "ids": ids,
        "log_probs": log_probs,
        "score": real_models.score(log_probs, ids, log_probs),
        "greedy": greedy,
    }


def evaluate(reference, model):
    ids = reference["ids"]
    score = real_models.score(
        real_models.next_token_log_probs(model, ids), ids, reference["log_probs"]
    )
    greedy = real_models.greedy(
        model, reference["tokenizer"], real_models.GREEDY_PROMPT, NEW_TOKENS
    )
    return score.perplexity / reference["score"].perplexity - 1, score, greedy


@pytest.mark.parametrize("mode", list(BOUNDS))
def test_quantized_model_keeps_its_quality(reference, mode):
    model = copy.deepcopy(reference["model"]).to(torch.bfloat16)
    if mode == "bf16":
        fot.apply(model)
    else:
        fot.apply(model, quantize=mode)
    delta, score, greedy = evaluate(reference, model)
    label = f"{reference['name']} {mode}: perplexity {delta:+.2%}, KL {score.kl_divergence:.4f}"
    assert delta <= BOUNDS[mode], label
    assert real_models.first_difference(greedy, reference["greedy"]) >= 2, (
        label,
        reference["tokenizer"].decode(greedy),
    )
    float_repeats = real_models.repeated_fraction(reference["greedy"])
    assert real_models.repeated_fraction(greedy) <= float_repeats + 0.25, (
        label,
        reference["tokenizer"].decode(greedy),
    )


def test_the_old_int4_default_is_told_apart(reference):
    """Every linear at 4 bits, symmetric, groups of 128 (the default before
    the recipe): the scoring must show it far worse than the recipe, or it
    could not catch a broken quantizer."""
    model = copy.deepcopy(reference["model"]).to(torch.bfloat16)
    fot.apply(model)
    fuseops.quantize_(model, "w4a16", group_size=128, scheme="symmetric", recipe="uniform")
    delta, score, _ = evaluate(reference, model)
    assert delta > 3 * BOUNDS["w4a16"], f"{reference['name']}: {delta:+.2%}"
    assert score.kl_divergence > 0.2


def test_the_scores_helpers(reference):
    """The scored text is long enough and real (the float model's own
    perplexity on it is that of prose, not of noise or of a recited text);
    the repetition and divergence measures see what they claim to."""
    assert len(real_models.TEXT_PATH.read_text().split()) > 2000
    assert 5 < reference["score"].perplexity < 40, reference["score"]
    assert reference["score"].kl_divergence == pytest.approx(0, abs=1e-9)
    with pytest.raises(ValueError, match="fewer than 100000"):
        real_models.text_ids(reference["tokenizer"], 100000)
    assert real_models.repeated_fraction(list(range(20))) == 0
    assert real_models.repeated_fraction([1, 2, 3, 4, 5] * 8) > 0.8
    assert real_models.first_difference([1, 2, 3], [1, 2, 4]) == 2
    assert real_models.first_difference([1, 2], [1, 2, 3]) == 2


def test_bench_quality_command(tmp_path):
    """``bench --quality`` on one model and two rows, few tokens: the
    table and JSON hold each row's quality beside its bits and speed."""
    result = subprocess.run(
        [
            sys.executable, "-m", "fuseops", "bench", "--quality",
            "--quality-models", "smollm2-135m", "--quality-rows", "HF bf16,w4a16",
            "--quality-tokens", "256", "--quality-new-tokens", "3", "--quality-repeats", "1",
            "--threads", "1", "--out", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "| w4a16 |" in result.stdout and "| HF bf16 |" in result.stdout, result.stdout
    data = json.loads((tmp_path / "quality.json").read_text())
    [model] = data["results"]
    rows = {row["row"]: row for row in model["rows"]}
    assert list(rows) == ["HF bf16", "w4a16"]
    hf, w4 = rows["HF bf16"], rows["w4a16"]
    assert hf["bits_per_weight"] == 16
    # The mixed recipe: the 4-bit layers at 5 bits (scale and zero per 32),
    # the head (a fifth of the weights) and the value projections at 8
    # and a bit (the scale and column sum per channel).
    assert 5 < w4["bits_per_weight"] < 6.5, w4
    assert abs(hf["perplexity_delta"]) <= BOUNDS["bf16"], hf
    assert 0 < w4["perplexity_delta"] <= BOUNDS["w4a16"], w4
    assert w4["kl_divergence"] > hf["kl_divergence"] >= 0
    assert hf["speed_vs_hf_bf16"] in (1, None)
    assert w4["ms_per_token"] is None or w4["ms_per_token"] > 0
    refused = subprocess.run(
        [sys.executable, "-m", "fuseops", "bench", "--quality", "--quality-rows", "w2",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert refused.returncode == 2 and "unknown --quality-rows ['w2']" in refused.stderr
