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
1.2% (w8a8, whose activations are rounded to int8 as well, per token then)
relative (in norm) over 5 seeds. The bound, 3%, leaves 2.5x margin; a wrong
scale, a transposed or a float weight gives an error of order 100% or 0.
The exact check is against the float math of the same int8 numbers: the
w8a16 model against the float model whose linear weights are the
dequantized int8 weights (q * s), to float32 accumulation (measured 3e-7 of
the largest logit, bound 1e-5); the w8a8 layers, each on the inputs it got,
against their float64 reference (tests_py/support/int8_math.py), since a
float32 difference of 1e-7 upstream can move an activation across an int8
rounding boundary and one such step moves the logits by about 1e-3.

llama.cpp's anchor (bench --decode's llama.cpp rows, tests skipped where the
optional extra bench-llama is not installed): the tiny model's bfloat16
weights written as GGUF and run by llama.cpp give logits within 0.37% (in
norm) of the float32 model of the same weights (llama.cpp rounds the
activations of its BF16 products to bfloat16 too; bound 1%); written
without llama.cpp's q/k row order they are 50-60% off past the first
position (RoPE pairs other channels). Q8_0 (weights and activations in
blocks of 32, int8) measured 1.6% (bound 3%, that of fuseops' int8 modes),
Q4_0 (4-bit weights in blocks of 32, about 9% error per weight) 22%
(bound 40%); each must be above the one before.
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
from fuseops.bench import llama_cpp_anchor as anchor  # noqa: E402
from fuseops.ops.quantize import quantize_per_channel_int8  # noqa: E402
from support.int8_math import assert_block_dynamic_matches, block_dynamic_reference  # noqa: E402
from support.tiny_llama import CONFIG, VOCAB  # noqa: E402

NEW_TOKENS = 32
PAD = 0

#: Relative error (in norm) of the quantized model's logits against the
#: float model's (derivation in the module docstring).
QUANTIZED_LOGITS_BOUND = 3e-2
#: The w8a16 model against the float model of its dequantized weights, of
#: the largest logit: float32 accumulation in another order.
DEQUANTIZED_BOUND = 1e-5

#: llama.cpp's logits of the GGUF files against the float32 model of the
#: same bfloat16 weights, relative in norm (module docstring).
BF16_LOGITS_BOUND = 1e-2
Q4_0_LOGITS_BOUND = 0.4

#: The llama.cpp anchor's tests need the optional extra bench-llama, which
#: CI does not install.
LLAMA_CPP_MISSING = anchor.missing_modules()
needs_llama_cpp = pytest.mark.skipif(
    bool(LLAMA_CPP_MISSING),
    reason=f"{' and '.join(LLAMA_CPP_MISSING)} not installed (pip install 'fuseops[bench-llama]')",
)


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


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("batch", [1, 2])
def test_greedy_generate_makes_hf_tokens(batch, cache):
    # With a static cache, each decode step's attention layers run
    # fuseops.rope_cache_attention (rotary, cache write, attention in one
    # call); HF's model with the same cache is the reference.
    ref = tiny_model()
    patched = copy.deepcopy(ref)
    assert fot.apply(patched)
    ids, mask = prompts(batch)
    want = greedy(ref, ids, mask, cache_implementation=cache)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = greedy(patched, ids, mask, cache_implementation=cache)
    fused = sum(e.name == "fuseops::rope_cache_attention" for e in prof.events())
    # Every step after the prefill, in every layer.
    assert fused == (NEW_TOKENS - 1) * CONFIG["num_hidden_layers"] * (cache == "static"), fused
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


@pytest.mark.parametrize("quantize", [None, "w4a8"])
def test_compile_decoding_runs_compiled_steps_with_the_eager_results(quantize):
    # The eager model with the same static cache is the reference: the
    # compiled step calls the same fuseops ops, and inductor computes the
    # few float32 element-wise ops between them (residual adds, the rotary
    # table) in the same order, so the tokens are equal and the scores
    # agree to float32 rounding (bound 1e-4 of the largest score; measured
    # 0 to 1e-6).
    if quantize is not None and quantize not in fot.quantize_modes():
        pytest.skip(f"{quantize} is not in this installation's quantize modes")
    eager = tiny_model()
    fot.apply(eager, quantize=quantize)
    compiled = copy.deepcopy(eager)
    fot.compile_decoding(compiled)
    assert compiled.generation_config.cache_implementation == "static"
    ids, mask = prompts(2)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = greedy(compiled, ids, mask, new_tokens=6)
    regions = sum(e.name.startswith("Torch-Compiled Region") for e in prof.events())
    # The prefill eager, each of the 5 later steps one compiled graph, whose
    # attention layers call fuseops.rope_cache_attention.
    assert regions == 5, regions
    fused = sum(
        e.name == "fuseops::rope_cache_attention"
        and e.cpu_parent is not None
        and e.cpu_parent.name.startswith("## Call CompiledFxGraph")
        for e in prof.events()
    )
    assert fused == 5 * CONFIG["num_hidden_layers"], fused
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    want = greedy(eager, ids, mask, new_tokens=6, cache_implementation="static")
    torch.testing.assert_close(got.sequences, want.sequences, rtol=0, atol=0)
    for got_scores, want_scores in zip(got.scores, want.scores):
        # min_new_tokens sets the end-of-sequence score to -inf in both.
        finite = torch.isfinite(want_scores)
        assert torch.equal(finite, torch.isfinite(got_scores))
        scale = want_scores[finite].abs().max().item()
        assert (got_scores - want_scores)[finite].abs().max().item() <= 1e-4 * scale


def test_compile_decoding_keeps_two_models_apart():
    # Without guards on the modules, two models of one class compiled in one
    # process would share the first one's graph (here: the float model's
    # graph reading a quantized layer's missing weight).
    float_model, quantized = tiny_model(0), tiny_model(1)
    fot.apply(float_model)
    fot.apply(quantized, quantize="w8a8")
    ids, mask = prompts(1)
    want = [
        greedy(m, ids, mask, new_tokens=4, cache_implementation="static").sequences
        for m in (float_model, quantized)
    ]
    torch._dynamo.reset()
    for model in (float_model, quantized):
        fot.compile_decoding(model)
    got = [greedy(m, ids, mask, new_tokens=4).sequences for m in (float_model, quantized)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert not torch.equal(want[0], want[1])


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
        assert_block_dynamic_matches(y, block_dynamic_reference(x, wq, scale), x.shape[-1])


@pytest.mark.parametrize("mode", fot.quantize_modes())
def test_quantize_replaces_every_linear_and_generates(mode):
    model = tiny_model()
    linears = _linear_names(model)
    assert "lm_head" in linears
    # Each layer on its own (test_fused_projections.py: q/k/v and gate/up merged).
    replaced = fot.apply(model, quantize=mode, fuse_projections=False)
    quantized = [r for r in replaced if r.old == "Linear"]
    assert sorted(r.name for r in quantized) == linears
    # The int4 modes' default recipe keeps the head and the value
    # projections at 8 bits (quantize_'s "mixed"), every other layer in `mode`.
    eight = {"w4a16": "w8a16", "w4a8": "w8a8"}.get(mode)
    for r in quantized:
        if eight is None:
            want = mode
        elif r.name == "lm_head":
            want = "w8a16"
        else:
            want = eight if r.name.endswith("v_proj") else mode
        assert f"({want!r})" in r.new, (r.name, r.new)
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
    with pytest.raises(ValueError, match="unknown recipe 'mostly'; supported: 'mixed', 'pure'"):
        fot.apply(model, quantize="w8a16", recipe="mostly")
    assert not fot.is_patched(model)  # a refused call changes nothing
    fot.apply(model, quantize="w8a16")
    with pytest.raises(ValueError, match="quantized with quantize='w8a16'"):
        fot.apply(model, quantize="w8a8")


@pytest.mark.parametrize("recipe", ["pure", "uniform"])
def test_quantize_recipe_reaches_every_layer(recipe):
    """apply(recipe=) is quantize_'s: "pure" keeps only the head at 8
    bits, "uniform" none; neither keeps v_proj out of the merged qkv_proj."""
    if "w4a16" not in quantization.QUANTIZE_MODES:
        pytest.skip("this installation has no int4 modes")
    model = tiny_model()
    replaced = fot.apply(model, quantize="w4a16", recipe=recipe)
    quantized = {r.name: r.new for r in replaced if r.old == "Linear" and "Slice" not in r.new}
    for name, new in quantized.items():
        want = "w8a16" if recipe == "pure" and name == "lm_head" else "w4a16"
        assert f"({want!r})" in new, (name, new)
    assert any(name.endswith("qkv_proj") for name in quantized), sorted(quantized)


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
    # are multiples), float32 scales, and in W8A8 only the int16 column
    # sums, one per block of 32 inputs and output.
    outputs = sum(m.out_features for m in linears)
    colsums = sum(-(-m.in_features // 32) * m.out_features for m in linears)
    fot.apply(model, quantize="w8a16")
    int8_bytes = weights + 4 * outputs + 2 * norms + rotary
    assert decode.bytes_read_per_step(model, 1) == int8_bytes + 2 * hidden
    for module in model.modules():
        if isinstance(module, quantization.Int8Linear):
            module.mode = "w8a8"
    assert decode.bytes_read_per_step(model, 1) == int8_bytes + 2 * colsums + 2 * hidden


def test_quality_bench_bits_per_weight():
    """bench --quality's bits per weight: stored bytes of the linear
    layers (weights, scales, zero points, W8A8's column sums; no bias) x 8
    over their weights."""
    from fuseops.bench import quality

    linear = torch.nn.Linear(64, 32, bias=True, dtype=torch.bfloat16)
    assert quality.bits_per_weight(torch.nn.Sequential(linear)) == 16
    int8 = quantization.Int8Linear.from_float(linear, mode="w8a16")
    # 2048 int8 weights (64 x 32, whole packing blocks) and 32 float32
    # scales; W8A8 adds its int16 column sums (2 blocks of 32 x 32 outputs).
    assert quality.bits_per_weight(torch.nn.Sequential(int8)) == 8 * (2048 + 4 * 32) / 2048
    int8.mode = "w8a8"
    assert quality.bits_per_weight(torch.nn.Sequential(int8)) == 8 * (2048 + 8 * 32) / 2048
    if "w4a16" in quantization.QUANTIZE_MODES:
        int4 = quantization.Int4Linear.from_float(linear, group_size=32)
        # Two weights a byte, a bfloat16 scale and zero per 32: 5 bits.
        assert quality.bits_per_weight(torch.nn.Sequential(int4)) == 5
        both = torch.nn.Sequential(int4, quantization.Int8Linear.from_float(linear))
        assert quality.bits_per_weight(both) == (5 * 2048 + 8 * (2048 + 128)) / 4096


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
    expected = [
        "HF bf16",
        "fuseops bf16",
        "fuseops bf16, ATen linear",
        "fuseops w8a16",
        "fuseops w8a8",
    ]
    expected += [f"fuseops {m}" for m in ("w4a16", "w4a8") if m in quantization.QUANTIZE_MODES]
    if "w4a8" in quantization.QUANTIZE_MODES:
        expected.append("fuseops w4a8, float32 scales")
    expected.append("fuseops w8a16, projections separate")
    expected.append("fuseops w8a16, static cache")
    expected.append("fuseops w8a16, SDPA attention")
    expected.append("torch.ao dynamic int8 (float32 activations)")
    if not LLAMA_CPP_MISSING:
        expected += ["llama.cpp BF16", "llama.cpp Q8_0", "llama.cpp Q4_0"]
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
        "% of read",
        "weights MiB",
        "peak MiB",
    ]
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in lines
        if line.startswith("| ") and not line.startswith(("| variant", "| ---"))
    ]
    assert [(r[0], r[1]) for r in rows] == [(v, b) for v in expected for b in ("1", "8")]
    [anchor_line] = [line for line in lines if line.startswith("llama.cpp anchor")]
    if LLAMA_CPP_MISSING:
        assert anchor_line.startswith("llama.cpp anchor (BF16/Q8_0/Q4_0) skipped: ")
    else:
        assert anchor_line.startswith("llama.cpp anchor (BF16/Q8_0/Q4_0): rows ")

    report = json.loads(json_path.read_text())
    assert report["copy_gb_per_s"] > 0 and report["read_gb_per_s"] > 0
    assert report["new_tokens"] == 4
    assert set(report["method"]) == {"timing", "bytes_read", "copy", "read", "peak_memory"}
    [size] = report["results"]
    assert size["size"] == "tiny" and size["parameters"] > 0
    assert [row["variant"] for row in size["rows"]] == expected
    assert report["llama_cpp"] == anchor_line
    for row in size["rows"]:
        assert "error" not in row and row["weights_bytes"] > 0
        assert [b["batch"] for b in row["batches"]] == [1, 8]
        for b in row["batches"]:
            assert b["bytes_read_per_step"] > 0 and b["generate_s"] > 0 and b["prefill_s"] > 0
            # None where the timing noise of so short a run left no decode time.
            for key in ("ms_per_token", "tokens_per_s", "gb_per_s"):
                assert b[key] is None or b[key] > 0, (key, b)
            for key in ("percent_of_copy", "percent_of_read"):
                assert b[key] is None or isinstance(b[key], float), (key, b)
            if b["gb_per_s"] is not None:
                assert b["percent_of_read"] == pytest.approx(
                    100 * b["gb_per_s"] / report["read_gb_per_s"]
                )
    assert (tmp_path / "decode.txt").read_text().strip() == result.stdout.split("\nwrote ")[0]
    if "w4a8" in quantization.QUANTIZE_MODES:
        # bfloat16 scale_zero (Int4Linear's default) against float32: the
        # packed weights alike, the scales and zero points half the bytes.
        by_name = {row["variant"]: row for row in size["rows"]}
        bf16, f32 = by_name["fuseops w4a8"], by_name["fuseops w4a8, float32 scales"]
        assert bf16["weights_bytes"] < f32["weights_bytes"]
        assert bf16["batches"][0]["bytes_read_per_step"] < f32["batches"][0]["bytes_read_per_step"]


# --- the llama.cpp anchor: the model as GGUF, decoded by llama.cpp ---


def _hf_rope(q, positions, base):
    """Hugging Face's rotary embedding (rotate_half) of q (..., d), float64."""
    d = q.shape[-1]
    freqs = positions[:, None] * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    rotated = torch.cat([-q[..., d // 2 :], q[..., : d // 2]], -1)
    return q * cos + rotated * sin


def _ggml_rope(q, positions, base):
    """llama.cpp's rotary embedding of the llama architecture (channels 2i
    and 2i + 1 rotated together by position * base^(-2i/d)), float64."""
    d = q.shape[-1]
    theta = positions[:, None] * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    even, odd = q[..., 0::2], q[..., 1::2]
    out = torch.empty_like(q)
    out[..., 0::2] = even * theta.cos() - odd * theta.sin()
    out[..., 1::2] = even * theta.sin() + odd * theta.cos()
    return out


def test_step_figures_of_a_run_noise_left_without_decode_time():
    memory = {"copy_gb_per_s": 20.0, "read_gb_per_s": 10.0}
    # 4 tokens: 3 steps of 10 ms after a 50 ms prefill; 4e6 bytes per step.
    measured = decode.step_figures(0.050, 0.080, 4, 2, 4_000_000, memory)
    assert measured["ms_per_token"] == pytest.approx(10.0)
    assert measured["tokens_per_s"] == pytest.approx(200.0)
    assert measured["gb_per_s"] == pytest.approx(0.4)
    assert measured["percent_of_copy"] == pytest.approx(2.0)
    assert measured["percent_of_read"] == pytest.approx(4.0)
    # t_N below (or at) t_1: no step time, rather than a negative one.
    for total in (0.049, 0.050):
        unmeasured = decode.step_figures(0.050, total, 4, 2, 4_000_000, memory)
        assert unmeasured["bytes_read_per_step"] == 4_000_000
        assert all(unmeasured[key] is None for key in unmeasured if key != "bytes_read_per_step")
        assert decode.batch_cells({"variant": "v"}, unmeasured)[2:4] == ["-", "-"]


def test_bench_decode_variants_selects_rows_and_compile_decoding_runs(tmp_path):
    chosen = ["HF bf16", "fuseops w8a8, compile_decoding"]
    base = [sys.executable, "-m", "fuseops", "bench", "--decode", "--decode-size", "tiny"]
    base += ["--decode-new-tokens", "3", "--decode-prompt", "8", "--decode-repeats", "1"]
    base += ["--decode-batch", "1", "--threads", "1", "--out", str(tmp_path)]
    result = subprocess.run(
        base + ["--decode-compile", "--decode-variants", *chosen],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "decode.json").read_text())
    [size] = report["results"]
    assert [row["variant"] for row in size["rows"]] == chosen
    for row in size["rows"]:
        assert "error" not in row, row
    # A compiled row's name without --decode-compile is not a row.
    refused = subprocess.run(
        base + ["--decode-variants", chosen[1]], capture_output=True, text=True, timeout=300
    )
    assert refused.returncode == 2
    assert "unknown --decode-variants ['fuseops w8a8, compile_decoding']" in refused.stderr


@pytest.mark.parametrize("heads", [1, 4])
def test_rope_rows_carry_hf_rotary_embedding_to_llama_cpps(heads):
    # q = W x rotated by HF's RoPE must be q' = rope_rows(W) x rotated by
    # llama.cpp's, up to the same row order (which q.k does not see).
    d, hidden, positions, base = 16, 32, torch.arange(7, dtype=torch.float64), 10000.0
    gen = torch.Generator().manual_seed(heads)
    w = torch.randn(heads * d, hidden, generator=gen, dtype=torch.float64)
    x = torch.randn(len(positions), hidden, generator=gen, dtype=torch.float64)
    permuted = anchor.rope_rows(w, heads)
    hf = _hf_rope((x @ w.T).view(-1, heads, d), positions[:, None], base)
    ggml = _ggml_rope((x @ permuted.T).view(-1, heads, d), positions[:, None], base)
    # The row order maps HF's rotated rows onto llama.cpp's.
    order = anchor.rope_rows(torch.arange(heads * d)[:, None], heads)[:, 0]
    torch.testing.assert_close(
        ggml.reshape(len(positions), -1), hf.reshape(len(positions), -1)[:, order]
    )
    # Unpermuted weights under llama.cpp's RoPE give other numbers past position 0.
    wrong = _ggml_rope((x @ w.T).view(-1, heads, d), positions[:, None], base)
    assert (wrong - hf)[1:].abs().max() > 0.1
    with pytest.raises(anchor.NotConvertible, match="not 4 heads of an even size"):
        anchor.rope_rows(torch.zeros(12, 2), 4)


def test_gguf_tensors_of_the_model():
    model = tiny_model()
    tensors = dict(anchor.gguf_tensors(model))
    layer = [
        "attn_norm",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_norm",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ]
    want = {"token_embd.weight", "output_norm.weight", "output.weight"}
    want |= {f"blk.{i}.{n}.weight" for i in range(CONFIG["num_hidden_layers"]) for n in layer}
    assert set(tensors) == want
    layers = model.model.layers
    heads, kv_heads = CONFIG["num_attention_heads"], CONFIG["num_key_value_heads"]
    assert torch.equal(
        tensors["blk.1.attn_q.weight"], anchor.rope_rows(layers[1].self_attn.q_proj.weight, heads)
    )
    assert torch.equal(
        tensors["blk.1.attn_k.weight"],
        anchor.rope_rows(layers[1].self_attn.k_proj.weight, kv_heads),
    )
    assert not torch.equal(tensors["blk.1.attn_k.weight"], layers[1].self_attn.k_proj.weight)
    assert torch.equal(tensors["blk.1.attn_v.weight"], layers[1].self_attn.v_proj.weight)
    assert torch.equal(tensors["blk.0.ffn_down.weight"], layers[0].mlp.down_proj.weight)
    assert torch.equal(tensors["output.weight"], model.lm_head.weight)
    # A head tied to the embedding is the embedding: llama.cpp reads token_embd.
    torch.manual_seed(0)
    tied = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**dict(CONFIG, tie_word_embeddings=True))
    )
    assert "output.weight" not in dict(anchor.gguf_tensors(tied))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(attention_bias=True), "attention_bias=True"),
        (dict(mlp_bias=True), "mlp_bias=True"),
        (
            dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
            "RoPE type 'linear'",
        ),
        (dict(head_dim=8), "head size 8 x 4 heads != hidden 64"),
    ],
)
def test_what_cannot_be_converted(change, message):
    config = transformers.LlamaConfig(**dict(CONFIG, **change))
    with pytest.raises(anchor.NotConvertible, match=message):
        anchor.hyperparameters(config)
    other = transformers.MistralConfig(**CONFIG)
    with pytest.raises(anchor.NotConvertible, match="model type 'mistral', not 'llama'"):
        anchor.hyperparameters(other)
    hyper = anchor.hyperparameters(transformers.LlamaConfig(**CONFIG))
    assert (hyper.head_dim, hyper.kv_heads, hyper.rope_theta) == (16, 2, 10000.0)


def test_gguf_bytes_read_per_step():
    info = anchor.TensorInfo
    # GGUF shapes: the innermost dimension first, so token_embd is (hidden, vocab).
    tensors = [
        info("token_embd.weight", "Q4_0", (64, 256), 256 * 36),
        info("blk.0.attn_q.weight", "Q4_0", (64, 64), 64 * 36),
        info("output_norm.weight", "F32", (64,), 256),
        info("output.weight", "Q8_0", (64, 256), 256 * 68),
    ]
    assert anchor.stored_bytes(tensors) == 256 * 36 + 64 * 36 + 256 + 256 * 68
    for batch in (1, 8):
        want = batch * 36 + 64 * 36 + 256 + 256 * 68
        assert anchor.bytes_read_per_step(tensors, batch) == want
    # Tied: the head reads the whole embedding besides the rows looked up.
    tied = tensors[:-1]
    assert anchor.bytes_read_per_step(tied, 8) == 8 * 36 + 256 * 36 + 64 * 36 + 256


def test_llama_cpp_anchor_line(monkeypatch):
    monkeypatch.setattr(anchor, "missing_modules", lambda: ["llama_cpp", "gguf"])
    assert decode.llama_cpp_anchor() == (
        "llama.cpp anchor (BF16/Q8_0/Q4_0) skipped: llama_cpp and gguf not importable; "
        "pip install llama-cpp-python gguf, or pip install 'fuseops[bench-llama]'"
    )
    monkeypatch.setattr(anchor, "missing_modules", lambda: [])
    line = decode.llama_cpp_anchor([], {"tiny": "RoPE type 'llama3'"})
    assert line == "llama.cpp anchor (BF16/Q8_0/Q4_0) skipped: size tiny: RoPE type 'llama3'"
    line = decode.llama_cpp_anchor(["small"], {"tiny": "why"})
    assert line.startswith(
        "llama.cpp anchor (BF16/Q8_0/Q4_0): rows 'llama.cpp BF16', 'llama.cpp Q8_0', "
        "'llama.cpp Q4_0' ("
    )
    assert anchor.METHOD in line and line.endswith("; skipped for size tiny: why")


def test_llama_cpp_process_failures_are_the_rows_errors(tmp_path, monkeypatch):
    timing = dict(
        batches=[1],
        vocab=VOCAB,
        prompt=4,
        new_tokens=2,
        repeats=1,
        threads=1,
        memory={"copy_gb_per_s": 1.0, "read_gb_per_s": 1.0},
    )
    # A real child that fails: no such file (or no llama_cpp to read it with).
    with pytest.raises(RuntimeError, match=r"^the llama.cpp process exited with status 1: .*Error"):
        decode._llama_cpp_timed(str(tmp_path / "none.gguf"), **timing)

    # A crash: the signal named, and the AMX hint where llama.cpp was built with AMX.
    def crashed(stderr):
        def run(*args, **kwargs):
            return subprocess.CompletedProcess(args, -11, "", stderr)

        return run

    monkeypatch.setattr(subprocess, "run", crashed("CPU : AVX2 = 1 | AMX_INT8 = 1 |\n"))
    with pytest.raises(RuntimeError, match=r"died of SIGSEGV \(llama.cpp's AMX kernels crash"):
        decode._llama_cpp_timed(str(tmp_path / "none.gguf"), **timing)
    monkeypatch.setattr(subprocess, "run", crashed("CPU : AVX2 = 1 |\n"))
    with pytest.raises(RuntimeError, match=r"died of SIGSEGV: CPU : AVX2 = 1 \|$"):
        decode._llama_cpp_timed(str(tmp_path / "none.gguf"), **timing)


@needs_llama_cpp
def test_gguf_names_are_gguf_packages():
    import gguf

    model = tiny_model()
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, CONFIG["num_hidden_layers"])
    for name in model.state_dict():
        if not name.endswith("inv_freq"):
            assert names.get_name(name, try_suffixes=(".weight",)) == anchor.gguf_name(name), name


def _relative(got, want):
    return ((got - want).norm() / want.norm()).item()


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    """The float32 model of the tiny model's weights rounded to bfloat16, its
    GGUF files and their folder. q and k are scaled up so that attention
    scores are of order 1 (about 0.03 as initialized, where attention is
    near uniform and the rotary embedding barely moves the logits)."""
    model = tiny_model()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight *= 10
            layer.self_attn.k_proj.weight *= 10
    model = model.to(torch.bfloat16)
    folder = tmp_path_factory.mktemp("gguf")
    paths = anchor.convert(model, str(folder), threads=1)
    return model.float(), paths, folder


@needs_llama_cpp
def test_llama_cpp_logits_match_the_hf_model(gguf_model, monkeypatch):
    reference, paths, folder = gguf_model
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = reference(input_ids=ids).logits
    errors = {}
    for quant, path in paths.items():
        with anchor.Model(path) as model, anchor.Decoder(model, 2, 16, threads=1) as decoder:
            got = decoder.logits(ids.numpy())
        assert got.shape == want.shape
        errors[quant] = _relative(got, want)
        types = {t.name: t.type for t in anchor.tensor_infos(path)}
        assert types["blk.0.attn_q.weight"] == quant
        assert types["blk.1.ffn_down.weight"] == quant
        assert types["output_norm.weight"] == "F32"
    assert errors["BF16"] < BF16_LOGITS_BOUND, errors
    assert 1e-3 < errors["Q8_0"] < QUANTIZED_LOGITS_BOUND, errors
    assert errors["BF16"] < errors["Q8_0"] < errors["Q4_0"] < Q4_0_LOGITS_BOUND, errors

    # Without llama.cpp's q/k row order the attention of later positions is wrong.
    monkeypatch.setattr(anchor, "rope_rows", lambda weight, heads: weight)
    anchor.write_gguf(reference.to(torch.bfloat16), str(folder / "unpermuted.gguf"))
    with anchor.Model(str(folder / "unpermuted.gguf")) as model:
        with anchor.Decoder(model, 2, 16, threads=1) as decoder:
            got = decoder.logits(ids.numpy())
    assert _relative(got[:, 0], want[:, 0]) < BF16_LOGITS_BOUND  # position 0: no rotation
    assert _relative(got, want) > 20 * BF16_LOGITS_BOUND


@needs_llama_cpp
def test_decoder_makes_llama_cpp_pythons_greedy_tokens(gguf_model):
    import llama_cpp

    _, paths, _ = gguf_model
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(6))
    for quant in ("BF16", "Q4_0"):
        with anchor.Model(paths[quant]) as model:
            with anchor.Decoder(model, 2, 6 + 10, threads=1) as decoder:
                got = decoder.generate(ids, 10)
                assert torch.equal(decoder.generate(ids, 3), got[:, :3])  # an empty cache again
            # One sequence at a time: the same tokens.
            for row in range(2):
                with anchor.Decoder(model, 1, 6 + 10, threads=1) as decoder:
                    assert torch.equal(decoder.generate(ids[row : row + 1], 10)[0], got[row])
        assert got.shape == (2, 10) and len(set(got.flatten().tolist())) > 2
        llm = llama_cpp.Llama(paths[quant], n_ctx=64, n_threads=1, verbose=False)
        for row in range(2):
            stream = llm.generate(ids[row].tolist(), temp=0.0, reset=True)
            want = [next(stream) for _ in range(10)]
            assert got[row].tolist() == want, (quant, row)
        llm.close()
