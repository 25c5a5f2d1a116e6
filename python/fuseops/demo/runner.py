"""One demo run: the settings, the plain, fuseops and (optionally) compiled
models trained on the same batches, and the summary of what they did."""

from __future__ import annotations

import copy
import os
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn

import fuseops

from ..bench.timing import peak_memory
from ..nn import SwiGLUMLP, TorchLinearCrossEntropyLoss, TorchRotaryEmbedding
from .data import corpus, make_batches
from .model import ModelConfig, TinyLlama, use_fuseops
from .quantized import quantized_inference
from .training import Trainer, _warmup_steps, train


@dataclass
class DemoSettings:
    steps: int = 150
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    seq_len: int = 128
    batch_size: int = 16
    lr: float = 3e-3
    dtype: str = "float32"
    seed: int = 0
    compile: bool = False
    progress: bool = True
    #: fuseops.cpu.tune_memory() applied before training (every run shares it).
    tune_memory: bool = False
    #: Held-out batches on which the trained model is evaluated as trained
    #: and after fuseops.quantize_ in each mode (0: no such evaluation).
    quantized_eval_batches: int = 4


def lm_head_peak_bytes(config: ModelConfig, settings: DemoSettings, dtype: torch.dtype) -> dict:
    """Peak memory of one forward+backward of the LM head's projection and
    loss alone, plain torch against fuseops, on one batch's hidden states:
    what the fused loss saves by never forming the logits."""
    gen = torch.Generator().manual_seed(settings.seed)
    tokens = settings.batch_size * config.seq_len
    hidden = torch.randn(tokens, config.d_model, generator=gen).to(dtype).requires_grad_()
    weight = torch.randn(config.vocab_size, config.d_model, generator=gen).to(dtype)
    weight.requires_grad_()
    targets = torch.randint(0, config.vocab_size, (tokens,), generator=gen)
    peaks = {}
    for name, head in (
        ("torch.nn", TorchLinearCrossEntropyLoss()),
        ("fuseops", fuseops.nn.LinearCrossEntropyLoss()),
    ):

        def step(head=head):
            head(hidden, weight, targets).backward()
            hidden.grad = weight.grad = None

        step()  # warm-up: first-call allocations are not the head's
        peaks[name] = peak_memory(step, torch.device("cpu"))
    return {
        "tokens": tokens,
        "vocab_size": config.vocab_size,
        "logits_bytes": tokens * config.vocab_size * torch.finfo(dtype).bits // 8,
        "peak_bytes": peaks,
    }


def run_demo(settings: DemoSettings) -> dict:
    """Trains the plain, the fuseops and (optionally) the compiled model;
    returns the summary (losses included)."""
    text, source = corpus()
    batches = make_batches(
        text, settings.steps, settings.batch_size, settings.seq_len, settings.seed
    )
    config = ModelConfig(
        vocab_size=len(batches.vocab),
        d_model=settings.d_model,
        n_layers=settings.n_layers,
        n_heads=settings.n_heads,
        seq_len=settings.seq_len,
    )
    dtype = getattr(torch, settings.dtype)
    memory_settings = fuseops.cpu.tune_memory() if settings.tune_memory else None
    torch.manual_seed(settings.seed)
    initial = TinyLlama(config).to(dtype)

    plain = copy.deepcopy(initial)
    with_fuseops = copy.deepcopy(initial)
    replaced = use_fuseops(with_fuseops)

    runs = [Trainer("torch.nn", plain, settings.lr), Trainer("fuseops", with_fuseops, settings.lr)]
    if settings.compile:
        runs.append(Trainer("torch.compile", torch.compile(copy.deepcopy(initial)), settings.lr))
    train(runs, batches, settings.progress)

    quantized = []
    if settings.quantized_eval_batches:
        held_out = make_batches(
            text,
            settings.quantized_eval_batches,
            settings.batch_size,
            settings.seq_len,
            settings.seed + 1,
        ).tokens
        quantized = quantized_inference(with_fuseops, held_out)

    base = runs[0]
    diffs = [abs(a - b) for a, b in zip(base.losses, runs[1].losses)]
    first = min(10, len(diffs))
    last = min(20, len(diffs))
    summary = {
        "settings": asdict(settings),
        "model": {
            **asdict(config),
            "ffn_hidden": config.ffn_hidden,
            "parameters": sum(p.numel() for p in initial.parameters()),
        },
        "data": {"source": source, "characters": len(text), "vocab_size": len(batches.vocab)},
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "memory_settings": memory_settings,
        "torch_version": torch.__version__,
        "fuseops_version": fuseops.__version__,
        "fuseops_cpu_capability": fuseops.build_info()["selected_cpu_capability"],
        "replaced": replaced,
        "not_replaced": [
            {"name": name, "type": type(module).__name__}
            for name, module in with_fuseops.named_modules()
            if type(module)
            in (nn.RMSNorm, SwiGLUMLP, TorchRotaryEmbedding, TorchLinearCrossEntropyLoss)
        ],
        "lm_head": lm_head_peak_bytes(config, settings, dtype),
        "quantized_inference": quantized,
        "loss_max_abs_diff": max(diffs) if diffs else 0.0,
        "loss_max_abs_diff_first_steps": max(diffs[:first]) if diffs else 0.0,
        "first_steps": first,
        "last_steps": last,
        "warmup_steps": _warmup_steps(settings.steps),
        "runs": {
            run.name: {
                "final_loss": run.losses[-1] if run.losses else None,
                "mean_loss_last_steps": (sum(run.losses[-last:]) / last if run.losses else None),
                "steps_per_second": run.steps_per_second,
                "speedup_vs_torch_nn": (
                    run.steps_per_second / base.steps_per_second
                    if run.steps_per_second and base.steps_per_second
                    else None
                ),
                "peak_step_bytes": run.peak_step_bytes,
                "warmup_seconds": run.warmup_seconds,
                "losses": run.losses,
            }
            for run in runs
        },
    }
    return summary
