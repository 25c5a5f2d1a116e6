"""Decoding with fuseops.transformers.apply, plain and quantized, and the
``python -m fuseops bench --decode`` command, on a tiny Llama built from a
config (float32, random weights from a fixed seed, nothing downloaded).

Greedy generation of the patched model must make exactly HF's tokens: the
float32 models differ only in the order of float32 sums inside the fused
ops (about 1e-6 of the logits, test_transformers.py), and the test checks
that the logits' lead over the runner-up stays far above that at every step,
so equal tokens are what a correct patch must give.

Quantized models: int8 per output channel rounds each weight to the nearest
multiple of its row's scale s = absmax / 127, an error uniform in +-s/2 of
RMS s / sqrt(12) = absmax / 440. The rows of these Gaussian weights have an
absmax of about 2.5-3 times their RMS, so each weight, and so each layer's
output, carries about 0.7% relative error; through the 2 layers' 7
projections each and the head the logits moved by 0.8-0.9% (w8a16) and
1.2% (w8a8, whose activations are rounded to int8 per token as well)
relative (in norm) over 5 seeds. The bound, 3%, leaves 2.5x margin; a wrong
scale, a transposed or a float weight gives an error of order 100% or 0.
The exact check is against the float math of the same int8 numbers: the
w8a16 model against the float model whose linear weights are the
dequantized int8 weights (q * s), to float32 accumulation (measured 3e-7 of
the largest logit, bound 1e-5); the w8a8 layers, each on the inputs it got,
against their float64 reference (tests_py/support/int8_math.py), since a
float32 difference of 1e-7 upstream can move an activation across an int8
rounding boundary and one such step moves the logits by about 1e-3.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install 'fuseops[transformers]')"
)

import fuseops.transformers as fot  # noqa: E402
from fuseops import quantization  # noqa: E402
from fuseops.bench import decode  # noqa: E402
from fuseops.ops.quantize import quantize_per_channel_int8  # noqa: E402
from support.int8_math import assert_dynamic_matches, dynamic_reference  # noqa: E402
from support.tiny_llama import CONFIG, VOCAB  # noqa: E402

NEW_TOKENS = 32
PAD = 0

#: Relative error (in norm) of the quantized model's logits against the
#: float model's (derivation in the module docstring).
QUANTIZED_LOGITS_BOUND = 3e-2
#: The w8a16 model against the float model of its dequantized weights, of
#: the largest logit: float32 accumulation in another order.
DEQUANTIZED_BOUND = 1e-5


def tiny_model(seed: int = 0):
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()


def prompts(batch: int):
    """`batch` prompts of different lengths, left-padded, and their mask."""
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(1, VOCAB, (batch, 12), generator=gen)
    mask = torch.ones_like(ids)
    for row in range(1, batch):
        ids[row, : 3 * row] = PAD
        mask[row, : 3 * row] = 0
    return ids, mask


def greedy(model, ids, mask, new_tokens=NEW_TOKENS, **kwargs):
    return model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=PAD,
        output_scores=True,
        return_dict_in_generate=True,
        **kwargs,
    )


# --- greedy generation: the patched model makes HF's tokens ---


@pytest.mark.parametrize("batch", [1, 2])
def test_greedy_generate_makes_hf_tokens(batch):
    ref = tiny_model()
    patched = copy.deepcopy(ref)
    assert fot.apply(patched)
    ids, mask = prompts(batch)
    want, got = greedy(ref, ids, mask), greedy(patched, ids, mask)
    assert got.sequences.shape == (batch, ids.shape[1] + NEW_TOKENS)
    torch.testing.assert_close(got.sequences, want.sequences, rtol=0, atol=0)
    # Equal tokens mean something only if no step was a near tie.
    for want_scores, got_scores in zip(want.scores, got.scores):
        top2 = want_scores.topk(2, dim=-1).values
        lead = (top2[:, 0] - top2[:, 1]).min().item()
        # min_new_tokens sets the end-of-sequence score to -inf in both.
        finite = torch.isfinite(want_scores)
        assert torch.equal(finite, torch.isfinite(got_scores))
        difference = (got_scores - want_scores)[finite].abs().max().item()
        assert lead > 100 * difference, (lead, difference)
    assert len(set(want.sequences[:, ids.shape[1] :].flatten().tolist())) > 4


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_decode_steps_run_decode_attention(cache):
    # Left-padded prompts: the padding is masked in every step; a static
    # cache's unwritten slots are masked too (and hold zeros, never read).
    ref = tiny_model()
    patched = copy.deepcopy(ref)
    replaced = {r.name: r for r in fot.apply(patched)}
    assert replaced["<attention>"].old == "sdpa"
    ids, mask = prompts(2)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = greedy(patched, ids, mask, new_tokens=8, cache_implementation=cache)
    calls = sum(e.name == "fuseops::decode_attention" for e in prof.events())
    # The prompt (12 tokens) and each of the 7 later steps, in every layer.
    assert calls == 8 * CONFIG["num_hidden_layers"]
    want = greedy(ref, ids, mask, new_tokens=8, cache_implementation=cache)
    torch.testing.assert_close(got.sequences, want.sequences, rtol=0, atol=0)


def test_attention_false_keeps_sdpa():
    model = tiny_model()
    assert "<attention>" not in {r.name for r in fot.apply(model, attention=False)}
    assert model.config._attn_implementation == "sdpa"
    ids, mask = prompts(1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        greedy(model, ids, mask, new_tokens=2)
    assert not any(e.name == "fuseops::decode_attention" for e in prof.events())


# --- apply(model, quantize=...) ---


def _linear_names(model):
    return sorted(name for name, m in model.named_modules() if type(m) is torch.nn.Linear)


@pytest.mark.parametrize("mode", ["w8a16", "w8a8"])
def test_quantized_logits_against_the_float_model(mode):
    float_model = tiny_model()
    quantized = copy.deepcopy(float_model)
    fot.apply(quantized, quantize=mode)
    ids, mask = prompts(2)
    with torch.no_grad():
        want = float_model(input_ids=ids, attention_mask=mask).logits
        got = quantized(input_ids=ids, attention_mask=mask).logits
    error = ((got - want).norm() / want.norm()).item()
    assert 1e-4 < error < QUANTIZED_LOGITS_BOUND, error


def _dequantized(model):
    """A copy of `model` whose linear weights are their int8 per-channel
    quantization, dequantized (q * scale) in float32."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for module in model.modules():
            if type(module) is torch.nn.Linear:
                q, scale = quantize_per_channel_int8(module.weight)
                module.weight.copy_(q.float() * scale[:, None])
    return model


def test_w8a16_matches_the_float_model_of_its_dequantized_weights():
    float_model = tiny_model()
    quantized = copy.deepcopy(float_model)
    fot.apply(quantized, quantize="w8a16")
    reference = _dequantized(float_model)
    fot.apply(reference)  # the same fused ops around the linear layers
    ids, mask = prompts(2)
    with torch.no_grad():
        want = reference(input_ids=ids, attention_mask=mask).logits
        got = quantized(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, want, rtol=0, atol=DEQUANTIZED_BOUND * want.abs().max().item())


def test_w8a8_layers_match_their_int8_math():
    float_model = tiny_model()
    quantized = copy.deepcopy(float_model)
    # Layer by layer (merged layers give the same bits: test_fused_projections.py).
    fot.apply(quantized, quantize="w8a8", fuse_projections=False)
    weights = {
        name: module.weight.detach()
        for name, module in float_model.named_modules()
        if type(module) is torch.nn.Linear
    }
    calls = []
    for name, module in quantized.named_modules():
        if name in weights:
            module.register_forward_hook(
                lambda module, args, out, name=name: calls.append((name, args[0], out))
            )
    ids, mask = prompts(2)
    with torch.no_grad():
        quantized(input_ids=ids, attention_mask=mask)
    assert sorted({name for name, _, _ in calls}) == sorted(weights)
    for name, x, y in calls:
        wq, scale = quantize_per_channel_int8(weights[name])
        assert_dynamic_matches(y, dynamic_reference(x, wq, scale))


@pytest.mark.parametrize("mode", fot.quantize_modes())
def test_quantize_replaces_every_linear_and_generates(mode):
    model = tiny_model()
    linears = _linear_names(model)
    assert "lm_head" in linears
    # Each layer on its own (test_fused_projections.py: q/k/v and gate/up merged).
    replaced = fot.apply(model, quantize=mode, fuse_projections=False)
    quantized = [r for r in replaced if r.old == "Linear"]
    assert sorted(r.name for r in quantized) == linears
    assert all(f"({mode!r})" in r.new for r in quantized)
    assert _linear_names(model) == []
    assert fot.is_patched(model)  # the head is patched, then quantized
    # A second call re-quantizes nothing, patches nothing.
    assert fot.apply(model, quantize=mode) == []
    assert fot.apply(model) == []
    ids, mask = prompts(2)
    out = greedy(model, ids, mask, new_tokens=4)
    assert out.sequences.shape == (2, ids.shape[1] + 4)


def test_quantized_head_is_called_for_the_logits():
    model = tiny_model()
    fot.apply(model, quantize="w8a16")
    assert isinstance(model.lm_head, quantization.Int8Linear)
    heads = []
    model.lm_head.register_forward_hook(lambda module, args, out: heads.append(out))
    ids, mask = prompts(1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=1).logits
    [head_out] = heads
    torch.testing.assert_close(logits, head_out, rtol=0, atol=0)
    assert logits.shape == (1, 1, VOCAB)


def test_quantized_model_refuses_training_and_computes_the_loss_without_grad():
    model = tiny_model()
    fot.apply(model, quantize="w8a8")
    model.train()
    ids, _ = prompts(1)
    with pytest.raises(RuntimeError, match=r"quantize='w8a8'.*inference-only"):
        model(input_ids=ids, labels=ids)
    # Training mode under no_grad (a validation loss): the logits path.
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)
    assert out.logits is not None
    want = torch.nn.functional.cross_entropy(out.logits[0, :-1], ids[0, 1:])
    torch.testing.assert_close(out.loss, want, rtol=1e-6, atol=0)


def test_quantize_mode_errors():
    model = tiny_model()
    with pytest.raises(ValueError, match="unknown quantize mode 'int3'; supported: None, 'w8a16'"):
        fot.apply(model, quantize="int3")
    if "w4a16" not in quantization.QUANTIZE_MODES:
        with pytest.raises(ValueError, match="unknown quantize mode 'w4a16'"):
            fot.apply(model, quantize="w4a16")
    assert not fot.is_patched(model)  # a refused call changes nothing
    fot.apply(model, quantize="w8a16")
    with pytest.raises(ValueError, match="quantized with quantize='w8a16'"):
        fot.apply(model, quantize="w8a8")


# --- the bench's accounting and command ---


def test_bytes_read_per_step():
    model = tiny_model().to(torch.bfloat16)
    hidden, vocab = CONFIG["hidden_size"], VOCAB
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    weights = sum(m.weight.numel() for m in linears)
    norms = (2 * CONFIG["num_hidden_layers"] + 1) * hidden
    # The rotary frequencies and their spare copy, a few bytes.
    rotary = sum(b.numel() * b.element_size() for b in model.model.rotary_emb.buffers())
    float_bytes = 2 * (weights + norms) + rotary
    for batch in (1, 8):
        want = float_bytes + 2 * batch * hidden  # one embedding row per sequence
        assert decode.bytes_read_per_step(model, batch) == want
    assert decode.stored_bytes(model) == float_bytes + 2 * vocab * hidden

    # Quantized: int8 weights (packed in blocks of 16 x 4, the sizes here
    # are multiples), float32 scales, the int32 column sums in W8A8 only.
    outputs = sum(m.out_features for m in linears)
    fot.apply(model, quantize="w8a16")
    int8_bytes = weights + 4 * outputs + 2 * norms + rotary
    assert decode.bytes_read_per_step(model, 1) == int8_bytes + 2 * hidden
    for module in model.modules():
        if isinstance(module, quantization.Int8Linear):
            module.mode = "w8a8"
    assert decode.bytes_read_per_step(model, 1) == int8_bytes + 4 * outputs + 2 * hidden


def test_bytes_of_torch_ao_dynamic_linear():
    # Several layers: each one's weight is unpacked for the count, and each
    # counts, whatever addresses the unpacked copies get.
    layers = [torch.nn.Linear(64, 32), torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)]
    model = decode._torch_ao_dynamic(torch.nn.Sequential(*layers))
    want = sum(layer.weight.numel() + 4 * layer.out_features for layer in layers)
    assert decode.bytes_read_per_step(model, 1) == want  # int8 weights, float biases
    assert decode.stored_bytes(model) == want


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/clear_refs")
def test_resident_peak_sees_memory_touched_and_freed_inside():
    with decode.resident_peak() as peak:
        block = torch.ones(64 << 20, dtype=torch.uint8)  # every page touched
        del block
    assert peak["bytes"] >= 60 << 20
    with decode.resident_peak() as idle:
        pass
    assert idle["bytes"] < 16 << 20


def test_bench_decode_command(tmp_path):
    json_path = tmp_path / "decode.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fuseops",
            "bench",
            "--decode",
            "--decode-size",
            "tiny",
            "--decode-new-tokens",
            "4",
            "--decode-prompt",
            "8",
            "--decode-repeats",
            "1",
            # One thread: two OpenMP threads on busy cores wait for each
            # other at every one of a step's many parallel regions.
            "--threads",
            "1",
            "--out",
            str(tmp_path),
            "--json",
            str(json_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    expected = ["HF bf16", "fuseops bf16", "fuseops w8a16", "fuseops w8a8"]
    expected += [f"fuseops {m}" for m in ("w4a16", "w4a8") if m in quantization.QUANTIZE_MODES]
    expected.append("fuseops w8a16, projections separate")
    expected.append("fuseops w8a16, SDPA attention")
    expected.append("torch.ao dynamic int8 (float32 activations)")
    lines = result.stdout.splitlines()
    assert any(line.startswith("OMP_WAIT_POLICY ") for line in lines)
    [columns] = [line for line in lines if line.startswith("| variant |")]
    assert [c.strip() for c in columns.strip("|").split("|")] == [
        "variant",
        "batch",
        "ms/token",
        "tokens/s",
        "MB read/step",
        "GB/s",
        "% of copy",
        "weights MiB",
        "peak MiB",
    ]
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in lines
        if line.startswith("| ") and not line.startswith(("| variant", "| ---"))
    ]
    assert [(r[0], r[1]) for r in rows] == [(v, b) for v in expected for b in ("1", "8")]
    assert any(line.startswith("llama.cpp anchor") for line in lines)

    report = json.loads(json_path.read_text())
    assert report["copy_gb_per_s"] > 0 and report["new_tokens"] == 4
    assert set(report["method"]) == {"timing", "bytes_read", "copy", "peak_memory"}
    [size] = report["results"]
    assert size["size"] == "tiny" and size["parameters"] > 0
    assert [row["variant"] for row in size["rows"]] == expected
    for row in size["rows"]:
        assert "error" not in row and row["weights_bytes"] > 0
        assert [b["batch"] for b in row["batches"]] == [1, 8]
        for b in row["batches"]:
            assert b["bytes_read_per_step"] > 0 and b["generate_s"] > 0 and b["prefill_s"] > 0
            assert isinstance(b["ms_per_token"], float)
            # None where the timing noise of so short a run left no decode time.
            for key in ("tokens_per_s", "gb_per_s", "percent_of_copy"):
                assert b[key] is None or isinstance(b[key], float), (key, b)
    assert (tmp_path / "decode.txt").read_text().strip() == result.stdout.split("\nwrote ")[0]
