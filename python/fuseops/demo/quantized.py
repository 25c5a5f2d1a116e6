"""The trained model's held-out loss, weight bytes and forward time, as
trained and after ``fuseops.quantize_`` in each mode."""

from __future__ import annotations

import copy
import math
import time

import torch
import torch.nn as nn

import fuseops


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
    from ..quantization import QUANTIZE_MODES

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
