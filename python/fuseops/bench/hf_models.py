"""``python -m fuseops bench --transformers [PRESET]``: a Hugging Face
Llama model (Mixtral for the ``moe`` presets: a mixture of experts, top 2
of 8) built from a config (random weights, nothing downloaded),
trained and run for inference as ``transformers`` ships it, after
``fuseops.transformers.apply`` and (unless ``--no-compile``) HF's and the
patched model under ``torch.compile``, one after the other in the same
process, and a ``transformers.Trainer`` run of each (float32 weights,
``bf16=True`` for bfloat16; AdamW's update included; its step speedup is
against the unpatched Trainer run).

A training step is ``zero_grad(set_to_none=True)``, the forward with labels
(HF's causal-LM loss) and the backward; the variants take turns, one step
each per round, after one warm-up step each, and the figure is each one's
median, and its peak memory the most memory allocated
during one step above what was allocated before it (weights excluded;
gradients, activations, logits and temporaries included; method in
``fuseops.bench.timing.PEAK_MEMORY_METHOD``). Prefill is the forward of an
inference call on the whole prompt as ``generate`` makes it (no gradients,
logits of the last position only, ``logits_to_keep=1``). The first
training step's losses are compared: the patched model's must agree with
HF's (1e-4 relative in float32, 2e-2 in bfloat16), or the run fails.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace

import torch

from .correctness import parse_dtypes
from .timing import PEAK_MEMORY_METHOD, peak_memory


@dataclass(frozen=True)
class LlamaShape:
    """A Llama model's dimensions (the decode benchmark's model sizes, and
    the start of this benchmark's presets)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    def config_options(self, max_positions: int) -> dict:
        """A transformers config's keyword arguments for these dimensions,
        with untied embeddings and room for ``max_positions`` tokens."""
        return dict(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=max(2048, max_positions),
            tie_word_embeddings=False,
        )


@dataclass(frozen=True)
class Preset(LlamaShape):
    seq: int
    batch: int
    steps: int  # timed training steps (after one warm-up step)
    # A mixture of experts (MixtralForCausalLM) of that many experts, each of
    # `intermediate`, `top_k` per token; 0: a dense Llama.
    experts: int = 0
    top_k: int = 2

    @property
    def model_class(self) -> str:
        return "MixtralForCausalLM" if self.experts else "LlamaForCausalLM"


PRESETS = {
    # Seconds: the tests' run of the command.
    "smoke": Preset(
        hidden=32,
        layers=1,
        heads=2,
        kv_heads=1,
        intermediate=64,
        vocab=1000,
        seq=64,
        batch=2,
        steps=2,
    ),
    # About a minute per dtype on 2 cores (torch.compile's compilation
    # included): 18M parameters, 1024 tokens.
    "small": Preset(
        hidden=256,
        layers=2,
        heads=4,
        kv_heads=2,
        intermediate=688,
        vocab=32000,
        seq=512,
        batch=2,
        steps=3,
    ),
    # The loss without logits at a Llama-3 vocabulary: 140M parameters
    # (most of them the embedding and the head), 1024 tokens whose
    # [tokens, vocab] float32 logits take 500 MiB each copy. Minutes on 2
    # cores.
    "large": Preset(
        hidden=512,
        layers=2,
        heads=8,
        kv_heads=4,
        intermediate=1408,
        vocab=128000,
        seq=512,
        batch=2,
        steps=2,
    ),
}

# The mixture-of-experts presets: Mixtral's routing (top 2 of 8) on the
# small presets' shapes.
PRESETS["moe-smoke"] = replace(PRESETS["smoke"], experts=4)
# 8 experts of intermediate 688 per layer: 27M parameters, 1024 tokens;
# minutes per dtype on 2 cores.
PRESETS["moe"] = replace(PRESETS["small"], experts=8)

LOSS_TOLERANCE = {
    torch.float32: 1e-4,
    torch.bfloat16: 2e-2,
    torch.float16: 2e-2,
    torch.float64: 1e-10,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--transformers",
        nargs="?",
        const="small",
        default=None,
        choices=sorted(PRESETS),
        metavar="PRESET",
        help="instead of the ops: a Hugging Face Llama model (Mixtral for the moe "
        "presets) from a config, "
        "training step and prefill with and without fuseops.transformers."
        "apply (presets: "
        + ", ".join(
            f"{name}: {p.model_class}, hidden {p.hidden}, {p.layers} layers, vocab {p.vocab}, "
            f"{p.batch}x{p.seq} tokens"
            for name, p in PRESETS.items()
        )
        + "; default small); --dtype, --no-compile, --threads and --out apply",
    )


def _model(preset: Preset, dtype: torch.dtype):
    import transformers

    options = preset.config_options(preset.seq)
    torch.manual_seed(0)
    if preset.experts:
        # transformers' default experts implementation ("grouped_mm") is the
        # unpatched model's.
        config = transformers.MixtralConfig(
            **options, num_local_experts=preset.experts, num_experts_per_tok=preset.top_k
        )
        return transformers.MixtralForCausalLM(config).to(dtype)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**options)).to(dtype)


def _train_step(model, ids, labels):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    return loss.detach()


def _interleaved(fns: list, rounds: int) -> list[float]:
    """Median seconds per call of each of `fns`, called in turns (one call of
    each per round), so that a change in the machine's load hits them alike."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def _has_accelerate() -> bool:
    """Whether transformers.Trainer can run (it needs ``accelerate``, which
    ``fuseops[trainers]`` installs); said on stderr when not."""
    try:
        import accelerate  # noqa: F401
    except ImportError:
        print(
            "fuseops bench --transformers: no Trainer rows (pip install 'fuseops[trainers]' "
            "for accelerate)",
            file=sys.stderr,
        )
        return False
    return True


def _trainer_steps(model, ids, dtype: torch.dtype, steps: int) -> float:
    """Median seconds of a ``transformers.Trainer`` step on `model` (float32
    weights; ``bf16=True``, Trainer's autocast, for bfloat16), AdamW's
    update included: `steps` timed steps after one warm-up step, on the rows
    of `ids` as a dataset of one batch per step."""
    import tempfile

    import transformers

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(ids) * (steps + 1)

        def __getitem__(self, index):
            row = ids[index % len(ids)]
            return {"input_ids": row, "labels": row}

    times: list[float] = []

    class StepTimes(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.start)

    with tempfile.TemporaryDirectory() as out:
        arguments = transformers.TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=len(ids),
            max_steps=steps + 1,
            bf16=dtype == torch.bfloat16,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = transformers.Trainer(
            model=model, args=arguments, train_dataset=Rows(), callbacks=[StepTimes()]
        )
        trainer.train()
    return statistics.median(times[1:])


def _bench_dtype(preset: Preset, dtype: torch.dtype, compile_peer: bool) -> dict:
    import fuseops.transformers

    base = _model(preset, dtype)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, preset.vocab, (preset.batch, preset.seq), generator=gen)
    labels = ids.clone()
    params = sum(p.numel() for p in base.parameters())
    print(f"{str(dtype)[6:]}: {params / 1e6:.0f}M parameters", file=sys.stderr, flush=True)

    patched = copy.deepcopy(base)
    replaced = fuseops.transformers.apply(patched)
    # (name, module, what to call); the compiled peer is the unpatched model.
    variants = [("transformers", base, base), ("fuseops", patched, patched)]
    if compile_peer:
        torch._dynamo.reset()
        variants.append(("torch.compile", base, torch.compile(base)))
        # What a user who can compile gets from fuseops: the patched model
        # compiled (its ops trace without graph breaks).
        variants.append(("fuseops + torch.compile", patched, torch.compile(patched)))
    rows = []
    for name, module, call in variants:
        module.train()
        start = time.perf_counter()
        loss = _train_step(call, ids, labels).item()  # warm-up (compilation included)
        rows.append({"variant": name, "first_loss": loss, "warmup_s": time.perf_counter() - start})
        module.zero_grad(set_to_none=True)
    steps = _interleaved(
        [lambda call=call: _train_step(call, ids, labels) for _, _, call in variants], preset.steps
    )
    for row, (_, module, call), step_s in zip(rows, variants, steps):
        row["step_s"] = step_s
        row["tokens_per_s"] = ids.numel() / step_s
        row["peak_bytes"] = peak_memory(lambda: _train_step(call, ids, labels), ids.device)
        module.zero_grad(set_to_none=True)

    # Prefill, eager models only (the compiled peer would compile again for
    # inference).
    def prefill(model):
        with torch.no_grad():
            return model(input_ids=ids, logits_to_keep=1, use_cache=False).logits

    base.eval(), patched.eval()
    for model in (base, patched):
        prefill(model)
    prefills = _interleaved([lambda: prefill(base), lambda: prefill(patched)], 3)
    for row, model, prefill_s in zip(rows, (base, patched), prefills):
        row["prefill_s"] = prefill_s
        row["prefill_peak_bytes"] = peak_memory(lambda: prefill(model), ids.device)
    for row in rows:
        print(
            f"  {row['variant']}: step {row['step_s']:.3f} s, peak {row['peak_bytes'] / 2**20:.0f} MiB"
            + (f", prefill {row['prefill_s']:.3f} s" if "prefill_s" in row else ""),
            file=sys.stderr,
            flush=True,
        )
    # transformers.Trainer steps, HF's model and the patched one, each on
    # its own float32 copy of the weights.
    trainer_rows = []
    trainer_variants = (("Trainer", False), ("Trainer + fuseops", True))
    for name, patch in trainer_variants if _has_accelerate() else ():
        model = _model(preset, torch.float32)
        if patch:
            fuseops.transformers.apply(model)
        trainer_rows.append(
            {"variant": name, "step_s": _trainer_steps(model, ids, dtype, preset.steps)}
        )
        print(f"  {name}: step {trainer_rows[-1]['step_s']:.3f} s", file=sys.stderr, flush=True)
    reference = rows[0]["first_loss"]
    error = abs(rows[1]["first_loss"] - reference) / abs(reference)
    return {
        "dtype": str(dtype)[6:],
        "parameters": params,
        "patched_modules": len(replaced),
        "loss_relative_error": error,
        "loss_ok": error <= LOSS_TOLERANCE[dtype],
        "rows": rows,
        "trainer_rows": trainer_rows,
    }


def table(results: list[dict], preset_name: str) -> str:
    preset = PRESETS[preset_name]
    lines = [
        f"fuseops bench --transformers {preset_name}: {preset.model_class}, hidden "
        f"{preset.hidden}, {preset.layers} layers, {preset.heads}/{preset.kv_heads} heads, "
        + (
            f"{preset.experts} experts (top {preset.top_k}) of intermediate "
            if preset.experts
            else "intermediate "
        )
        + f"{preset.intermediate}, vocab {preset.vocab}, batch {preset.batch} x seq {preset.seq}, "
        f"{torch.get_num_threads()} threads",
        "",
        "| dtype | variant | train step | step speedup | peak MiB | peak vs HF | prefill | "
        "prefill speedup |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for result in results:
        hf = result["rows"][0]
        for row in result["rows"]:
            prefill = f"{row['prefill_s'] * 1e3:.0f} ms" if "prefill_s" in row else "-"
            prefill_ratio = (
                f"{hf['prefill_s'] / row['prefill_s']:.2f}x" if "prefill_s" in row else "-"
            )
            lines.append(
                f"| {result['dtype']} | {row['variant']} | {row['step_s']:.3f} s | "
                f"{hf['step_s'] / row['step_s']:.2f}x | {row['peak_bytes'] / 2**20:.0f} | "
                f"{100 * row['peak_bytes'] / hf['peak_bytes']:.0f}% | {prefill} | {prefill_ratio} |"
            )
        for row in result["trainer_rows"]:
            trainer_hf = result["trainer_rows"][0]
            lines.append(
                f"| {result['dtype']} | {row['variant']} | {row['step_s']:.3f} s | "
                f"{trainer_hf['step_s'] / row['step_s']:.2f}x | - | - | - | - |"
            )
        lines.append(
            f"| {result['dtype']} | loss check | first step's loss, fuseops vs HF: "
            f"{result['loss_relative_error']:.1e} relative "
            f"({'ok' if result['loss_ok'] else 'FAILED'}) | | | | | |"
        )
    return "\n".join(lines)


def cannot_run(flag: str, device: str) -> bool:
    """Whether a ``bench --transformers``/``--decode`` run (``flag``) lacks
    what it needs, transformers and a CPU, said on stderr."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        print(
            f"fuseops bench {flag}: transformers is not installed "
            "(pip install 'fuseops[transformers]')",
            file=sys.stderr,
        )
        return True
    if device != "cpu":
        print(f"fuseops bench {flag}: runs on cpu only", file=sys.stderr)
        return True
    return False


def run(args: argparse.Namespace) -> int:
    if cannot_run("--transformers", args.device):
        return 2
    import transformers

    if args.threads is not None:
        torch.set_num_threads(args.threads)

    dtypes = parse_dtypes(args.dtype) if isinstance(args.dtype, str) else args.dtype
    preset = PRESETS[args.transformers]
    results = [_bench_dtype(preset, dtype, not args.no_compile) for dtype in dtypes]
    text = table(results, args.transformers)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "transformers.json")
    with open(path, "w") as f:
        json.dump(
            {
                "preset": args.transformers,
                "config": asdict(preset),
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "peak_memory_method": PEAK_MEMORY_METHOD,
                "results": results,
            },
            f,
            indent=2,
        )
    with open(os.path.join(args.out, "transformers.txt"), "w") as f:
        f.write(text + "\n")
    print(f"wrote {path}")
    return 0 if all(result["loss_ok"] for result in results) else 1
