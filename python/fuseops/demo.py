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

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

import fuseops

from .bench.timing import peak_memory
from .nn import SwiGLUMLP, TorchLinearCrossEntropyLoss, TorchRotaryEmbedding


# ---------------------------------------------------------------------------
# Data


def corpus() -> tuple[str, str]:
    """(text, where it came from): the source of a standard-library module,
    which every Python installation ships, restricted to ASCII."""
    import argparse as source_module

    with open(source_module.__file__, encoding="utf-8") as f:
        text = f.read()
    text = "".join(ch for ch in text if ch == "\n" or 32 <= ord(ch) < 127)
    return text, f"{source_module.__file__} (Python {sys.version.split()[0]})"


@dataclass(frozen=True)
class Batches:
    tokens: torch.Tensor  # (steps, batch, seq_len + 1)
    vocab: list


def make_batches(text: str, steps: int, batch_size: int, seq_len: int, seed: int) -> Batches:
    vocab = sorted(set(text))
    index = {ch: i for i, ch in enumerate(vocab)}
    data = torch.tensor([index[ch] for ch in text], dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - seq_len - 1, (steps, batch_size), generator=gen)
    offsets = torch.arange(seq_len + 1)
    return Batches(tokens=data[starts[..., None] + offsets], vocab=vocab)


# ---------------------------------------------------------------------------
# Model


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    seq_len: int = 128
    eps: float = 1e-5

    @property
    def ffn_hidden(self) -> int:
        # Llama's 8/3 * d_model, rounded up to a multiple of 16.
        return 16 * math.ceil(8 * self.d_model / 3 / 16)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.out = nn.Linear(config.d_model, config.d_model, bias=False)
        # Plain torch (Hugging Face's rotate_half formula); replace_modules
        # swaps it for fuseops.nn.RotaryEmbedding.
        self.rotary = TorchRotaryEmbedding(
            config.d_model // config.n_heads, max_position_embeddings=config.seq_len
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        # q, k, v: strided [batch, seq, heads, head_dim] views of one projection.
        q, k, v = self.qkv(x).view(batch, seq, 3, self.n_heads, -1).unbind(2)
        q, k = self.rotary(q, k, torch.arange(seq, device=x.device))
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.out(y.transpose(1, 2).reshape(batch, seq, d))


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.d_model, eps=config.eps)
        self.attn = Attention(config)
        self.mlp_norm = nn.RMSNorm(config.d_model, eps=config.eps)
        self.mlp = SwiGLUMLP(config.d_model, config.ffn_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyLlama(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.RMSNorm(config.d_model, eps=config.eps)
        # The LM head's projection and loss (plain torch; replace_modules
        # swaps in fuseops.nn.LinearCrossEntropyLoss, which never forms the
        # [tokens, vocab] logits).
        self.loss = TorchLinearCrossEntropyLoss()

    def forward(self, tokens: torch.Tensor, targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The logits, or with `targets` the mean next-token loss."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        hidden = self.norm(x)
        # The output projection is tied to the embedding.
        if targets is None:
            return F.linear(hidden, self.embed.weight)
        return self.loss(hidden, self.embed.weight, targets)


def use_fuseops(model: nn.Module) -> list[dict]:
    """Swaps fuseops into `model` in place with `fuseops.nn.replace_modules`.
    Returns what was replaced, as dicts of name, old and new."""
    return [
        {"name": r.name, "old": r.old, "new": f"fuseops.nn.{r.new}"}
        for r in fuseops.nn.replace_modules(model)
    ]


# ---------------------------------------------------------------------------
# Training


def _warmup_steps(steps: int) -> int:
    # At least two: the first step compiles (under --compile) and allocates
    # the optimizer state; the last warm-up step is the one measured for memory.
    return min(5, max(2, steps // 5))


class Trainer:
    """One model, its optimizer, its losses and the time its steps took."""

    def __init__(self, name: str, model: nn.Module, lr: float):
        self.name = name
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        self.losses: list[float] = []
        self.timed_seconds = 0.0
        self.timed_steps = 0
        self.warmup_seconds = 0.0
        self.peak_step_bytes: Optional[int] = None

    def _step(self, tokens: torch.Tensor) -> None:
        loss = self.model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.losses.append(loss.item())

    def step(self, tokens: torch.Tensor, timed: bool, measure_memory: bool) -> None:
        if measure_memory:
            self.peak_step_bytes = peak_memory(lambda: self._step(tokens), torch.device("cpu"))
            return
        start = time.perf_counter()
        self._step(tokens)
        elapsed = time.perf_counter() - start
        if timed:
            self.timed_seconds += elapsed
            self.timed_steps += 1
        else:
            self.warmup_seconds += elapsed

    @property
    def steps_per_second(self) -> Optional[float]:
        return self.timed_steps / self.timed_seconds if self.timed_seconds > 0 else None


#: Plain progress lines per training run, where no bar can draw.
PLAIN_PROGRESS_LINES = 10


def train(trainers: list[Trainer], batches: Batches, progress: bool) -> None:
    """Trains every model on the same batches, taking turns step by step, so
    that whatever else the machine is doing slows them alike. The first few
    steps are warm-up (allocator, torch.compile) and are not timed; the last of
    them runs under the memory profiler for the peak memory of one step.
    Progress: a tqdm bar on a terminal, else (a log, which would keep every
    frame of a bar) a plain line at each tenth of the steps."""
    steps = batches.tokens.shape[0]
    warmup = _warmup_steps(steps)
    bar = None
    if progress and sys.stderr.isatty():
        try:
            from tqdm import tqdm

            bar = tqdm(
                total=steps, desc="training", unit="step", file=sys.stderr, dynamic_ncols=True
            )
        except ImportError:
            pass
    every = max(1, math.ceil(steps / PLAIN_PROGRESS_LINES))
    for index in range(steps):
        for trainer in trainers:
            trainer.step(
                batches.tokens[index], timed=index >= warmup, measure_memory=index == warmup - 1
            )
        losses = {t.name: f"{t.losses[-1]:.3f}" for t in trainers}
        if bar is not None:
            bar.update(1)
            bar.set_postfix(losses)
        elif progress and ((index + 1) % every == 0 or index + 1 == steps):
            print(
                f"training step {index + 1}/{steps}: loss "
                + ", ".join(f"{name} {loss}" for name, loss in losses.items()),
                file=sys.stderr,
                flush=True,
            )
    if bar is not None:
        bar.close()


# ---------------------------------------------------------------------------
# Quantized inference


def _linear_weight_bytes(model: nn.Module) -> int:
    """Bytes of the weights of the model's linear layers as stored: a float
    nn.Linear's weight, or the int8/int4/2:4 buffers (values, mask, scales,
    zero points, column sums; biases excluded) of the fuseops layers that
    replace it."""
    total = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            total += module.weight.numel() * module.weight.element_size()
        elif isinstance(
            module, (fuseops.nn.Int8Linear, fuseops.nn.Int4Linear, fuseops.nn.Sparse24Linear)
        ):
            total += sum(
                b.numel() * b.element_size()
                for name, b in module.named_buffers(recurse=False)
                if name != "bias" and b is not None
            )
    return total


def _evaluate(model: nn.Module, tokens: torch.Tensor) -> tuple[float, float]:
    """(mean next-token loss over the batches, seconds per batch's forward)."""
    losses, seconds = [], []
    with torch.inference_mode():
        model(tokens[0][:, :-1], tokens[0][:, 1:])  # warm-up: first-call allocations
        for batch in tokens:
            start = time.perf_counter()
            losses.append(model(batch[:, :-1], batch[:, 1:]).item())
            seconds.append(time.perf_counter() - start)
    seconds.sort()
    return sum(losses) / len(losses), seconds[len(seconds) // 2]


def quantized_inference(model: nn.Module, tokens: torch.Tensor) -> list[dict]:
    """The trained model's held-out loss and perplexity, the bytes of its
    linear layers' weights and its forward time, as trained and after
    ``fuseops.quantize_`` in each mode (on a copy). The embedding, which is
    also the tied output projection, stays as trained in every mode."""
    from .quantization import QUANTIZE_MODES

    rows = []
    for mode in (None, *QUANTIZE_MODES):
        candidate = copy.deepcopy(model)
        changed = [] if mode is None else fuseops.quantize_(candidate, mode=mode)
        loss, seconds = _evaluate(candidate, tokens)
        rows.append(
            {
                "mode": mode or "as trained",
                "layers_quantized": len(changed),
                "loss": loss,
                "perplexity": math.exp(loss),
                "linear_weight_bytes": _linear_weight_bytes(candidate),
                "forward_seconds": seconds,
            }
        )
    return rows


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


def report(summary: dict) -> str:
    lines = []
    model = summary["model"]
    lines.append(
        f"model: {model['n_layers']} layers, d_model {model['d_model']}, {model['n_heads']} "
        f"heads, SwiGLU hidden {model['ffn_hidden']}, {model['parameters'] / 1e6:.2f} M "
        f"parameters, {summary['settings']['dtype']}; data: {summary['data']['characters']} "
        f"characters of {summary['data']['source']}"
    )
    lines.append(
        f"{summary['settings']['steps']} steps of batch "
        f"{summary['settings']['batch_size']} x {model['seq_len']}, "
        f"{summary['threads']} threads, fuseops CPU build "
        f"{summary['fuseops_cpu_capability']}; memory: "
        + (
            f"fuseops.cpu.tune_memory(keep_bytes="
            f"{summary['memory_settings']['keep_bytes']}) for every run"
            if summary.get("memory_settings")
            else "process defaults"
        )
    )
    replaced, kept = summary["replaced"], summary["not_replaced"]
    if replaced:
        lines.append(
            f"fuseops replaced {len(replaced)} modules: "
            + ", ".join(f"{r['name']} ({r['old']} -> {r['new']})" for r in replaced)
        )
    else:
        lines.append(
            "fuseops replaced NOTHING: the installed fuseops.nn has no RMSNorm, "
            "SwiGLU or RotaryEmbedding, so the 'fuseops' run executes the same torch "
            "code as the 'torch.nn' run, and its figures show run-to-run noise, "
            "not fuseops"
        )
    if kept:
        lines.append(
            "still plain torch (no fuseops drop-in installed): "
            + ", ".join(f"{k['name']} ({k['type']})" for k in kept)
        )
    lines.append("")
    last_header = f"last {summary['last_steps']} mean"
    width = max(14, *(len(name) for name in summary["runs"]))
    lines.append(
        f"{'run':<{width}}  {'final loss':>10}  {last_header:>12}  {'steps/s':>8}  "
        f"{'vs torch.nn':>11}  {'peak MiB/step':>13}"
    )
    for name, run in summary["runs"].items():
        speed = run["steps_per_second"]
        ratio = run["speedup_vs_torch_nn"]
        peak = run["peak_step_bytes"]
        lines.append(
            f"{name:<{width}}  {run['final_loss']:>10.4f}  {run['mean_loss_last_steps']:>12.4f}  "
            f"{'-' if speed is None else f'{speed:.2f}':>8}  "
            f"{'-' if ratio is None else f'{ratio:.2f}x':>11}  "
            f"{'-' if peak is None else f'{peak / 2**20:.1f}':>13}"
        )
    if any(run.get("other_process") for run in summary["runs"].values()):
        lines.append(
            "+ tune_memory: trained afterwards in a child process under fuseops.cpu."
            f"tune_memory(keep_bytes={summary['memory_settings_tuned']['keep_bytes']}); its "
            "ratio to torch.nn spans two processes, so it carries the machine's drift "
            "between them, while fuseops vs torch.nn within one process does not"
        )
    lines.append("")
    lines.append(
        f"loss curves torch.nn vs fuseops: max |difference| "
        f"{summary['loss_max_abs_diff_first_steps']:.3g} over the first "
        f"{summary['first_steps']} steps, {summary['loss_max_abs_diff']:.3g} over all "
        f"{summary['settings']['steps']}. Kernels that round differently start "
        "the runs apart by an ulp, and training amplifies any such difference, so "
        "later steps agree in trend (the mean of the last steps), not step by step"
    )
    head = summary["lm_head"]
    lines.append(
        f"LM head alone (projection + loss, forward+backward on {head['tokens']} tokens "
        f"x {head['vocab_size']} classes; logits {head['logits_bytes'] / 2**20:.2f} MiB): "
        f"peak {head['peak_bytes']['torch.nn'] / 2**20:.2f} MiB torch.nn, "
        f"{head['peak_bytes']['fuseops'] / 2**20:.2f} MiB fuseops"
    )
    quantized = summary.get("quantized_inference")
    if quantized:
        trained = quantized[0]
        lines.append("")
        lines.append(
            f"the trained fuseops model on {summary['settings']['quantized_eval_batches']} "
            "held-out batches, as trained and after fuseops.quantize_(model, mode) "
            "(linear layers only; the tied embedding stays as trained):"
        )
        lines.append(
            f"{'mode':<12}  {'layers':>6}  {'loss':>7}  {'perplexity':>10}  "
            f"{'linear weights MiB':>18}  {'forward ms':>10}  {'vs trained':>10}"
        )
        for row in quantized:
            lines.append(
                f"{row['mode']:<12}  {row['layers_quantized']:>6}  {row['loss']:>7.4f}  "
                f"{row['perplexity']:>10.3f}  {row['linear_weight_bytes'] / 2**20:>18.3f}  "
                f"{row['forward_seconds'] * 1e3:>10.2f}  "
                f"{trained['forward_seconds'] / row['forward_seconds']:>9.2f}x"
            )
        lines.append(
            "forward ms: median of the batches' inference forward (loss included); "
            "2:4 prunes the trained weights without fine-tuning, so its loss shows "
            "what pruning alone costs"
        )
    lines.append(
        f"steps/s excludes the first {summary['warmup_steps']} steps (warm-up, "
        "compilation); peak MiB/step: most memory allocated during one training "
        "step above what was allocated before it (torch.profiler memory events)"
    )
    return "\n".join(lines)


def write_plot(path: str, summary: dict) -> bool:
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_diff) = plt.subplots(
        2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    styles = {"torch.nn": ("-", 2.5), "fuseops": ("--", 1.2), "torch.compile": (":", 1.2)}
    for name, run in summary["runs"].items():
        style, width = styles.get(name, ("-", 1))
        ax.plot(run["losses"], style, linewidth=width, label=name)
    ax.set_ylabel("training loss (cross entropy)")
    ax.legend()
    ax.set_title(
        f"TinyLlama on {os.path.basename(summary['data']['source'].split()[0])}, "
        f"{summary['settings']['dtype']}, {summary['threads']} threads",
        fontsize=10,
    )
    base = summary["runs"]["torch.nn"]["losses"]
    for name, run in summary["runs"].items():
        if name != "torch.nn":
            # Equal losses (difference 0) sit at the floor of the log scale.
            ax_diff.plot(
                [max(abs(a - b), 1e-9) for a, b in zip(run["losses"], base)],
                label=name,
                linewidth=1,
            )
    ax_diff.set_yscale("log")
    ax_diff.set_ylabel("|loss - torch.nn|")
    ax_diff.legend(fontsize=8)
    ax_diff.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


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


def _child_arguments(settings: DemoSettings, args: argparse.Namespace, out: str) -> list[str]:
    """Command-line arguments that rerun `settings` in another process."""
    argv = [
        "--steps",
        settings.steps,
        "--d-model",
        settings.d_model,
        "--layers",
        settings.n_layers,
        "--heads",
        settings.n_heads,
        "--seq-len",
        settings.seq_len,
        "--batch-size",
        settings.batch_size,
        "--lr",
        settings.lr,
        "--dtype",
        settings.dtype,
        "--seed",
        settings.seed,
        "--out",
        out,
        "--no-plot",
        "--no-progress",
        # The quantized evaluation concerns the trained model, not the
        # memory settings: the parent's run reports it.
        "--quantized-eval-batches",
        0,
    ]
    if args.threads is not None:
        argv += ["--threads", args.threads]
    if settings.compile:
        argv.append("--compile")
    return [str(a) for a in argv]


def run_tuned_child(settings: DemoSettings, args: argparse.Namespace, out: str) -> dict:
    """Trains the same models in a child process under tune_memory(); returns
    its summary. The child's own report goes to stderr, as progress."""
    import subprocess

    command = [
        sys.executable,
        "-m",
        "fuseops",
        "demo",
        "--tune-memory",
        *_child_arguments(settings, args, out),
    ]
    print(
        "== the same runs under fuseops.cpu.tune_memory(), in a child process",
        file=sys.stderr,
        flush=True,
    )
    result = subprocess.run(command, stdout=sys.stderr)
    if result.returncode != 0:
        raise RuntimeError(
            f"fuseops demo: the --tune-memory child failed "
            f"(exit {result.returncode}): {' '.join(command)}"
        )
    with open(os.path.join(out, "demo.json")) as f:
        return json.load(f)


def add_tuned_runs(summary: dict, tuned: dict) -> None:
    """Adds the child's runs as "<name> + tune_memory", their speed relative
    to the default-settings torch.nn run (timed in another process: ratios
    across the two carry the machine's drift between them)."""
    base = summary["runs"]["torch.nn"]["steps_per_second"]
    summary["memory_settings_tuned"] = tuned["memory_settings"]
    for name, run in tuned["runs"].items():
        speed = run["steps_per_second"]
        summary["runs"][f"{name} + tune_memory"] = {
            **run,
            "speedup_vs_torch_nn": speed / base if speed and base else None,
            "other_process": True,
        }


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
