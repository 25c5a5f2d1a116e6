"""``python -m fuseops bench --quality``: what each quantize mode costs in
quality beside what it gains in speed, on real pretrained models
(``real_models``: SmolLM2-135M-Instruct and Gemma 3 270M, the real-models
extra), so that no mode is picked for its speed without its cost in view.

For each model, each row is the float32 model loaded afresh, cast to
bfloat16 and prepared as the row says: HF's bfloat16 model unpatched,
``fuseops.transformers.apply(model)``, and ``apply(model, quantize=mode,
recipe=...)`` for every quantize mode this installation has (the int4
modes in the default "mixed" recipe, and w4a16 once more in "pure", every
linear at 4 bits but the head). Each row gives:

- perplexity on the first ``--quality-tokens`` tokens of
  ``real_models.TEXT_PATH`` (teacher forced), its change against the
  float32 model's, and the mean KL divergence of the row's next-token
  distributions from float32's (nats);
- the greedy continuation of ``real_models.GREEDY_PROMPT``: the first
  token where it leaves float32's, and the fraction of its 4-grams seen
  before in it (a loop is near 1);
- bits per weight: the bytes the model's linear layers store (int8/int4
  weights with their scales and zero points, a float layer's weight) times
  8 over their weights' count, the LM head included, the embedding and
  the biases not;
- decode speed at batch 1: ``(t_N - t_1) / (N - 1)`` for greedy generates
  of N = ``--quality-new-tokens`` and of 1 new token after a 128-token
  prompt of the text, each the median of ``--quality-repeats`` runs after
  a warm-up of both (the method of ``--decode``), and the ratio of HF
  bfloat16's ms per token to the row's (above 1: faster).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import statistics
import sys
from dataclasses import dataclass
from typing import Any, Optional

import torch

from . import real_models
from .decode import _generator, _list_of, _positive, _timed
from .environment import cpu_model


@dataclass(frozen=True)
class Row:
    name: str
    #: None: HF's model unpatched; "": apply() without quantize.
    quantize: Optional[str]
    recipe: str = "mixed"


def rows() -> list[Row]:
    """The rows of this installation: the int4 ones where it has them."""
    from ..quantization import QUANTIZE_MODES

    out = [Row("HF bf16", None), Row("fuseops bf16", "")]
    for mode in ("w8a16", "w8a8", "w4a16", "w4a8"):
        if mode in QUANTIZE_MODES:
            out.append(Row(mode, mode))
            if mode == "w4a16":
                out.append(Row("w4a16 pure", mode, "pure"))
    return out


PROMPT_TOKENS = 128
DEFAULT_TOKENS = 1024
DEFAULT_NEW_TOKENS = 32
DEFAULT_REPEATS = 3
GREEDY_TOKENS = 48


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quality",
        action="store_true",
        help="instead of the ops: each quantize mode on real pretrained models (the real-models "
        "extra): perplexity and KL divergence against float32, the greedy answer, bits per "
        "weight and decode ms per token side by side; --threads, --out and --json apply",
    )
    parser.add_argument(
        "--quality-models",
        type=_list_of(str, real_models.REAL_MODELS),
        default=list(real_models.REAL_MODELS),
        help=f"comma-separated real models (default {','.join(real_models.REAL_MODELS)})",
    )
    parser.add_argument(
        "--quality-rows",
        type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
        default=None,
        help="comma-separated rows (default all: " + ", ".join(r.name for r in rows()) + ")",
    )
    parser.add_argument(
        "--quality-tokens",
        type=_positive,
        default=DEFAULT_TOKENS,
        help=f"tokens of real text scored (default {DEFAULT_TOKENS})",
    )
    parser.add_argument(
        "--quality-new-tokens",
        type=_positive,
        default=DEFAULT_NEW_TOKENS,
        help=f"new tokens per timed generate, at least 2 (default {DEFAULT_NEW_TOKENS})",
    )
    parser.add_argument(
        "--quality-repeats",
        type=_positive,
        default=DEFAULT_REPEATS,
        help=f"timed generates of each length, the median kept (default {DEFAULT_REPEATS})",
    )


def bits_per_weight(model: torch.nn.Module) -> float:
    """8 x the bytes the linear layers store (quantized layers: every
    buffer but the bias; float layers: the weight) over their weights'
    count (module docstring)."""
    from ..quantization import _QuantizedLinear

    stored = weights = 0
    for module in model.modules():
        if isinstance(module, _QuantizedLinear):
            stored += sum(
                b.numel() * b.element_size()
                for name, b in module.named_buffers(recurse=False)
                if name != "bias" and b is not None
            )
            weights += module.in_features * module.out_features
        elif type(module) is torch.nn.Linear:
            stored += module.weight.numel() * module.weight.element_size()
            weights += module.weight.numel()
    return 8 * stored / weights


def _prepared(model: torch.nn.Module, row: Row) -> torch.nn.Module:
    import fuseops.transformers

    if row.quantize is None:
        return model
    if row.quantize == "":
        fuseops.transformers.apply(model)
    else:
        fuseops.transformers.apply(model, quantize=row.quantize, recipe=row.recipe)
    return model


def _decode_ms(model, ids: torch.Tensor, new_tokens: int, repeats: int) -> Optional[float]:
    generate = _generator(model, ids, new_tokens, static_cache=False)
    generate(1)
    generate(new_tokens)
    prefill = statistics.median(_timed(lambda: generate(1)) for _ in range(repeats))
    total = statistics.median(_timed(lambda: generate(new_tokens)) for _ in range(repeats))
    step = (total - prefill) / (new_tokens - 1)
    return step * 1e3 if step > 0 else None


def _bench_model(name: str, selected: list[Row], args) -> dict:
    reference, tokenizer = real_models.load(name, torch.float32)
    ids = real_models.text_ids(tokenizer, args.quality_tokens)
    reference_log_probs = real_models.next_token_log_probs(reference, ids)
    float_score = real_models.score(reference_log_probs, ids, reference_log_probs)
    float_greedy = real_models.greedy(
        reference, tokenizer, real_models.GREEDY_PROMPT, GREEDY_TOKENS
    )
    prompt = ids[:, :PROMPT_TOKENS]
    results: list[dict[str, Any]] = []
    for row in selected:
        model = _prepared(copy.deepcopy(reference).to(torch.bfloat16), row)
        scored = real_models.score(
            real_models.next_token_log_probs(model, ids), ids, reference_log_probs
        )
        answer = real_models.greedy(model, tokenizer, real_models.GREEDY_PROMPT, GREEDY_TOKENS)
        results.append(
            {
                "row": row.name,
                "quantize": row.quantize,
                "recipe": row.recipe if row.quantize else None,
                "perplexity": scored.perplexity,
                "perplexity_delta": scored.perplexity / float_score.perplexity - 1,
                "kl_divergence": scored.kl_divergence,
                "greedy_first_difference": real_models.first_difference(answer, float_greedy),
                "greedy_repeated": real_models.repeated_fraction(answer),
                "bits_per_weight": bits_per_weight(model),
                "ms_per_token": _decode_ms(
                    model, prompt, args.quality_new_tokens, args.quality_repeats
                ),
            }
        )
        del model
    hf = next((r["ms_per_token"] for r in results if r["row"] == "HF bf16"), None)
    for r in results:
        ms = r["ms_per_token"]
        r["speed_vs_hf_bf16"] = hf / ms if hf and ms else None
    return {
        "model": name,
        "description": real_models.REAL_MODELS[name].description,
        "float32_perplexity": float_score.perplexity,
        "float32_greedy_repeated": real_models.repeated_fraction(float_greedy),
        "rows": results,
    }


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(result: dict, tokens: int) -> str:
    lines = [
        f"### {result['model']}: {result['description']}",
        "",
        f"float32 perplexity {result['float32_perplexity']:.3f} on {tokens} tokens; greedy "
        f"answer of {GREEDY_TOKENS} tokens, float32's 4-gram repeats "
        f"{result['float32_greedy_repeated']:.2f}",
        "",
        "| row | perplexity | vs float32 | KL | greedy leaves float at | greedy repeats "
        "| bits/weight | ms/token | speed vs HF bf16 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['row']} | {r['perplexity']:.3f} | {r['perplexity_delta']:+.2%} "
            f"| {r['kl_divergence']:.4f} | {r['greedy_first_difference']} "
            f"| {r['greedy_repeated']:.2f} | {r['bits_per_weight']:.2f} "
            f"| {_cell(r['ms_per_token'], '.2f')} | {_cell(r['speed_vs_hf_bf16'], '.2f')}x |"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    missing = real_models.missing_requirements()
    if missing is not None:
        print(f"fuseops bench --quality: {missing}", file=sys.stderr)
        return 2
    if args.quality_new_tokens < 2:
        print(
            "fuseops bench --quality: --quality-new-tokens must be at least 2 (the decode time "
            "is that of the tokens after the first)",
            file=sys.stderr,
        )
        return 2
    known = {r.name: r for r in rows()}
    names = args.quality_rows if args.quality_rows is not None else list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        print(
            f"fuseops bench --quality: unknown --quality-rows {unknown}; the rows: {list(known)}",
            file=sys.stderr,
        )
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    selected = [known[n] for n in names]
    torch.manual_seed(0)
    results = [_bench_model(name, selected, args) for name in args.quality_models]
    environment = {
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
    }
    header = (
        f"## Quantization on real models: {environment['cpu']} ({environment['cpu_capability']}), "
        f"{environment['threads']} threads, torch {environment['torch']}, {environment['date']}"
    )
    text = "\n\n".join([header] + [table(r, args.quality_tokens) for r in results])
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(args.json or os.path.join(args.out, "quality.json"), "w") as f:
        json.dump(
            {
                "environment": environment,
                "tokens": args.quality_tokens,
                "new_tokens": args.quality_new_tokens,
                "repeats": args.quality_repeats,
                "prompt_tokens": PROMPT_TOKENS,
                "method": __doc__,
                "results": results,
            },
            f,
            indent=2,
        )
    with open(os.path.join(args.out, "quality.txt"), "w") as f:
        f.write(text + "\n")
    return 0
