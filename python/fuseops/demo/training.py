"""Training the models side by side, step by step on the same batches, with
the time and peak memory of their steps."""

from __future__ import annotations

import math
import sys
import time
from typing import Optional

import torch
import torch.nn as nn

from ..bench.timing import peak_memory
from .data import Batches


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
