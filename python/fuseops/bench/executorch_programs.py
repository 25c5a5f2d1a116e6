"""``python -m fuseops bench --executorch``: the ExecuTorch programs of a
Hugging Face Llama patched by ``fuseops.transformers.apply``, float and
quantized: each ``.pte`` file's size, the time of one forward (the logits of
a prompt, no cache) in ExecuTorch's runtime and in PyTorch on the same
machine, and how far the program's logits are from PyTorch's (TIMING_METHOD).

The model is the ``--decode`` run's (``--executorch-size``: random weights
from a config, float32), quantized by ``apply(quantize=...)`` or, for the
2:4 modes that apply does not take, by ``fuseops.quantize_`` after
``apply``, and exported by :func:`fuseops.executorch.export`
(fuseops' ops decomposed to ATen, XNNPACK's partitioner where ExecuTorch has
it). A quantized model keeps its packed int8/int4 weights in the program and
dequantizes them in the graph: the file is smaller; the forward is what
ExecuTorch's kernels make of that graph. A variant named ``<mode>+fuseops``
(``w8a16+fuseops``) is exported with ``kernels="fuseops"`` instead: the
fuseops ops stay in the program and fuseops' own kernels run them
(:func:`fuseops.executorch.load_kernels`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Optional

import torch

from . import decode

DEFAULT_SIZE = "small"
DEFAULT_VARIANTS = (
    "float32",
    "w8a16",
    "w8a8",
    "w4a16",
    "w4a8",
    "2:4",
    "2:4+w8a16",
    "2:4+w8a8",
    "float32+fuseops",
    "w8a16+fuseops",
    "w8a8+fuseops",
    "w4a16+fuseops",
    "w4a8+fuseops",
    "2:4+fuseops",
    "2:4+w8a16+fuseops",
    "2:4+w8a8+fuseops",
)
#: The suffix of a variant whose program runs fuseops' kernels.
FUSEOPS_KERNELS = "+fuseops"
DEFAULT_PROMPT = 32
DEFAULT_REPEATS = 3

TIMING_METHOD = (
    "ms per forward: the median of the timed calls (after one untimed) of the model's forward "
    "on one prompt of --executorch-prompt tokens (batch 1, no KV cache, the logits of every "
    "position): ExecuTorch's Method.execute on the loaded .pte, and the patched model in "
    "PyTorch under torch.no_grad(); max abs diff: the largest difference between their logits."
)

TABLE_COLUMNS = [
    "variant",
    ".pte MiB",
    "vs float32",
    "ExecuTorch ms",
    "PyTorch ms",
    "max abs diff",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--executorch",
        action="store_true",
        help="instead of the ops: a Hugging Face Llama patched by fuseops.transformers.apply, "
        "float32 and quantized, exported to ExecuTorch programs (fuseops.executorch.export): "
        ".pte size, ms per forward in ExecuTorch and in PyTorch, the logits' difference; "
        "--threads, --out and --json apply (needs pip install 'fuseops[executorch]')",
    )
    parser.add_argument(
        "--executorch-size",
        choices=list(decode.SIZES),
        default=DEFAULT_SIZE,
        help=f"model size, as --decode-size (default {DEFAULT_SIZE})",
    )
    parser.add_argument(
        "--executorch-variants",
        nargs="+",
        metavar="NAME",
        default=list(DEFAULT_VARIANTS),
        help="float32 and fuseops.quantize_ modes (through apply(quantize=...) where it "
        "takes them), each decomposed to ExecuTorch's kernels, "
        f"or with {FUSEOPS_KERNELS} run by fuseops' kernels (default: "
        + " ".join(DEFAULT_VARIANTS)
        + ")",
    )
    parser.add_argument(
        "--executorch-prompt",
        type=int,
        default=DEFAULT_PROMPT,
        help=f"prompt tokens of the timed forward (default {DEFAULT_PROMPT})",
    )
    parser.add_argument(
        "--executorch-repeats",
        type=int,
        default=DEFAULT_REPEATS,
        help=f"timed calls, median taken (default {DEFAULT_REPEATS})",
    )


class _Logits(torch.nn.Module):
    """The model's logits of a prompt, without a cache: what is exported."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def _median_ms(call, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(size: str, variant: str, prompt: int, repeats: int, path: str) -> dict:
    """One variant's row: its program written to `path` and timed."""
    from executorch.runtime import Runtime

    import fuseops.executorch
    import fuseops.transformers

    spec = decode.SIZES[size]
    model = decode._model(spec, torch.float32, prompt)
    mode = variant.removesuffix(FUSEOPS_KERNELS)
    kernels = "fuseops" if mode != variant else "executorch"
    quantize: Optional[str] = None if mode == "float32" else mode
    if quantize is None or quantize in fuseops.transformers.quantize_modes():
        fuseops.transformers.apply(model, quantize=quantize)
    else:  # the 2:4 modes, which apply does not take
        fuseops.transformers.apply(model)
        fuseops.quantize_(model, quantize)
    module = _Logits(model).eval()
    ids = decode.prompt_ids(spec.vocab, 1, prompt)
    with torch.no_grad():
        program = fuseops.executorch.export(module, (ids,), path, kernels=kernels)
        expected = module(ids)
        pytorch_ms = _median_ms(lambda: module(ids), repeats)
    method = Runtime.get().load_program(program.buffer).load_method("forward")
    (logits,) = method.execute([ids])
    return {
        "variant": variant,
        "pte_bytes": os.path.getsize(path),
        "executorch_ms": _median_ms(lambda: method.execute([ids]), repeats),
        "pytorch_ms": pytorch_ms,
        "max_abs_diff": (logits - expected).abs().max().item(),
    }


def _cells(row: dict, float_bytes: Optional[int]) -> list[str]:
    if "error" in row:
        return [row["variant"], "ERROR: " + row["error"]] + ["-"] * (len(TABLE_COLUMNS) - 2)
    ratio = "-" if not float_bytes else f"{row['pte_bytes'] / float_bytes:.2f}x"
    return [
        row["variant"],
        f"{row['pte_bytes'] / 2**20:.1f}",
        ratio,
        f"{row['executorch_ms']:.1f}",
        f"{row['pytorch_ms']:.1f}",
        f"{row['max_abs_diff']:.1e}",
    ]


def table(rows: list[dict], size: str, prompt: int, repeats: int) -> str:
    spec = decode.SIZES[size]
    float_bytes = next(
        (r["pte_bytes"] for r in rows if r["variant"] == "float32" and "error" not in r), None
    )
    lines = [
        f"fuseops bench --executorch, size {size}: LlamaForCausalLM, hidden {spec.hidden}, "
        f"{spec.layers} layers, vocab {spec.vocab}; one forward of {prompt} tokens, median of "
        f"{repeats}",
        "",
        "| " + " | ".join(TABLE_COLUMNS) + " |",
        "| --- |" + " ---: |" * (len(TABLE_COLUMNS) - 1),
    ]
    lines += ["| " + " | ".join(_cells(r, float_bytes)) + " |" for r in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import sys

    try:
        import executorch.runtime  # noqa: F401
    except ImportError:
        print(
            "fuseops bench --executorch: ExecuTorch is not installed "
            "(pip install 'fuseops[executorch]')",
            file=sys.stderr,
        )
        return 2
    import fuseops.quantization

    modes = list(fuseops.quantization.QUANTIZE_MODES)
    unknown = [
        v
        for v in args.executorch_variants
        if v.removesuffix(FUSEOPS_KERNELS) != "float32"
        and v.removesuffix(FUSEOPS_KERNELS) not in modes
    ]
    if unknown:
        print(
            f"fuseops bench --executorch: unknown --executorch-variants {unknown}; float32 or "
            f"one of {modes}, each optionally with {FUSEOPS_KERNELS}",
            file=sys.stderr,
        )
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for variant in args.executorch_variants:
        path = os.path.join(args.out, f"llama-{args.executorch_size}-{variant}.pte")
        try:
            rows.append(
                measure(
                    args.executorch_size,
                    variant,
                    args.executorch_prompt,
                    args.executorch_repeats,
                    path,
                )
            )
        except Exception as error:  # a row's failure is its row's, not the run's
            rows.append({"variant": variant, "error": f"{type(error).__name__}: {error}"})
    env = decode._environment()
    text = "\n\n".join(
        [
            f"fuseops {env['fuseops_version']}, torch {env['torch_version']}; CPU "
            f"{env['cpu_model']}, {env['logical_cpus']} logical CPUs, {env['threads']} threads",
            table(rows, args.executorch_size, args.executorch_prompt, args.executorch_repeats),
            TIMING_METHOD,
        ]
    )
    print(text)
    json_path = args.json or os.path.join(args.out, "executorch.json")
    with open(json_path, "w") as f:
        json.dump(
            {
                "environment": env,
                "size": args.executorch_size,
                "prompt_tokens": args.executorch_prompt,
                "repeats": args.executorch_repeats,
                "method": TIMING_METHOD,
                "rows": rows,
            },
            f,
            indent=2,
        )
    with open(os.path.join(args.out, "executorch.txt"), "w") as f:
        f.write(text + "\n")
    print(f"wrote {json_path}")
    return 0 if all("error" not in r for r in rows) else 1
