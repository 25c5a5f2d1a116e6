"""``python -m fuseops demo``: one small language model trained twice.

A Llama-style decoder (token embedding, RMSNorm, causal self-attention with
rotary positions (``fuseops.nn.TorchRotaryEmbedding``, plain torch) via
``scaled_dot_product_attention``, SwiGLU MLP, output layer tied to the
embedding, its loss through ``fuseops.nn.TorchLinearCrossEntropyLoss``) learns to predict the next character of Python's
own ``argparse.py`` source. It is trained from the same seed on the same
batches twice: once as plain ``torch.nn`` (the MLP blocks are
``fuseops.nn.SwiGLUMLP``, plain torch too), once after
``fuseops.nn.replace_modules``, optionally a third time under
``torch.compile``. The loss curves must agree; the difference in speed and
memory is what fuseops buys.
"""

# The modules: ``data``, the corpus and its batches; ``model``, the
# Llama-style decoder and the swap to fuseops; ``training``, the models
# trained side by side, timed and measured; ``quantized``, the trained model
# after fuseops.quantize_; ``runner``, one run and its summary;
# ``reporting``, the summary's text and loss-curve chart; ``tuned``, the
# --compare-tune-memory child process. This file is the command line.

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

import torch

from .data import Batches, corpus, make_batches
from .model import Attention, Block, ModelConfig, TinyLlama, use_fuseops
from .quantized import quantized_inference
from .reporting import report, write_plot
from .runner import DemoSettings, lm_head_peak_bytes, run_demo
from .training import PLAIN_PROGRESS_LINES, Trainer, train
from .tuned import add_tuned_runs, run_tuned_child


#: Model and run sizes per ``--preset``; explicit flags override them.
#: "large" is where fuseops' tensors are megabytes (hidden 1024, 512
#: positions: 38 M parameters), still a few minutes on 2 cores; its
#: matrix products dominate the step (60% in bfloat16, 80% in float32), which
#: bounds what fused norms, activations and rotary embeddings can win.
PRESETS = {
    "small": {},
    "large": {
        "d_model": 1024,
        "n_layers": 3,
        "n_heads": 8,
        "seq_len": 512,
        "batch_size": 4,
        "steps": 16,
        "dtype": "bfloat16",
        "quantized_eval_batches": 2,
    },
}

# Command-line flag -> DemoSettings field, for the settings a preset sets.
_SIZE_FLAGS = {
    "steps": "steps",
    "d_model": "d_model",
    "layers": "n_layers",
    "heads": "n_heads",
    "seq_len": "seq_len",
    "batch_size": "batch_size",
    "dtype": "dtype",
    "quantized_eval_batches": "quantized_eval_batches",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = DemoSettings()
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="small",
        help="model and run sizes: small (default, the flags' defaults) or "
        "large ("
        + ", ".join(f"{k} {v}" for k, v in PRESETS["large"].items())
        + "); flags given explicitly override the preset",
    )
    parser.add_argument(
        "--steps", type=int, default=None, help=f"training steps per run (default {defaults.steps})"
    )
    parser.add_argument(
        "--d-model", type=int, default=None, help=f"model width (default {defaults.d_model})"
    )
    parser.add_argument(
        "--layers", type=int, default=None, help=f"decoder blocks (default {defaults.n_layers})"
    )
    parser.add_argument(
        "--heads", type=int, default=None, help=f"attention heads (default {defaults.n_heads})"
    )
    parser.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help=f"characters per sequence (default {defaults.seq_len})",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"sequences per step (default {defaults.batch_size})",
    )
    parser.add_argument(
        "--lr", type=float, default=defaults.lr, help=f"AdamW learning rate (default {defaults.lr})"
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help=f"weights and activations dtype (default {defaults.dtype})",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help=f"torch threads (default {torch.get_num_threads()} here)",
    )
    parser.add_argument(
        "--compile", action="store_true", help="also train torch.compile of the plain model"
    )
    parser.add_argument(
        "--out",
        default="demo-results",
        help="folder for demo.json and demo-loss.png (default demo-results)",
    )
    parser.add_argument(
        "--tune-memory",
        action="store_true",
        help="apply fuseops.cpu.tune_memory() first (freed memory kept for "
        "reuse, process-wide: every run trains under it)",
    )
    parser.add_argument(
        "--compare-tune-memory",
        action="store_true",
        help="after the runs under the default memory settings, train both "
        "models again in a child process under fuseops.cpu.tune_memory() "
        "and report all four (the setting is process-wide, so the tuned "
        "pair is timed in its own process)",
    )
    parser.add_argument(
        "--quantized-eval-batches",
        type=int,
        default=None,
        help="held-out batches on which the trained model is evaluated as "
        "trained and after fuseops.quantize_ in each mode (0: skip; "
        f"default {defaults.quantized_eval_batches})",
    )
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress (default: a bar on a terminal, else a line at each "
        "tenth of the steps on stderr)",
    )


def resolve_sizes(args: argparse.Namespace) -> dict:
    """The DemoSettings fields the preset and the size flags set: an explicit
    flag wins over the preset, the preset over DemoSettings' default."""
    defaults = asdict(DemoSettings())
    preset = PRESETS[args.preset]
    sizes = {}
    for flag, field in _SIZE_FLAGS.items():
        value = getattr(args, flag)
        sizes[field] = value if value is not None else preset.get(field, defaults[field])
    return sizes


def run(args: argparse.Namespace) -> int:
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    sizes = resolve_sizes(args)
    if args.tune_memory and args.compare_tune_memory:
        print(
            "fuseops demo: --tune-memory and --compare-tune-memory exclude each other "
            "(the comparison runs the default settings here and the tuned ones in a "
            "child process)",
            file=sys.stderr,
        )
        return 2
    args.steps, args.d_model, args.heads = sizes["steps"], sizes["d_model"], sizes["n_heads"]
    if args.steps < 3:
        print("fuseops demo: --steps must be at least 3 (two are warm-up)", file=sys.stderr)
        return 2
    if sizes["quantized_eval_batches"] < 0:
        print("fuseops demo: --quantized-eval-batches must be at least 0", file=sys.stderr)
        return 2
    if args.d_model % args.heads or (args.d_model // args.heads) % 2:
        print("fuseops demo: --d-model must split into --heads heads of even size", file=sys.stderr)
        return 2
    settings = DemoSettings(
        **sizes,
        lr=args.lr,
        seed=args.seed,
        compile=args.compile,
        progress=not args.no_progress,
        tune_memory=args.tune_memory,
    )
    summary = run_demo(settings)
    summary["preset"] = args.preset
    os.makedirs(args.out, exist_ok=True)
    if args.compare_tune_memory:
        add_tuned_runs(summary, run_tuned_child(settings, args, os.path.join(args.out, "tuned")))
    print(report(summary))
    json_path = os.path.join(args.out, "demo.json")
    with open(json_path, "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    written = [f"summary {json_path}"]
    if not args.no_plot:
        plot_path = os.path.join(args.out, "demo-loss.png")
        if write_plot(plot_path, summary):
            written.append(f"loss curves {plot_path}")
        else:
            written.append("no plot: matplotlib is not installed (pip install 'fuseops[bench]')")
    print("wrote " + "; ".join(written))
    return 0


__all__ = [
    "PLAIN_PROGRESS_LINES",
    "PRESETS",
    "Attention",
    "Batches",
    "Block",
    "DemoSettings",
    "ModelConfig",
    "TinyLlama",
    "Trainer",
    "add_arguments",
    "add_tuned_runs",
    "corpus",
    "lm_head_peak_bytes",
    "make_batches",
    "quantized_inference",
    "report",
    "resolve_sizes",
    "run",
    "run_demo",
    "run_tuned_child",
    "train",
    "use_fuseops",
    "write_plot",
]
