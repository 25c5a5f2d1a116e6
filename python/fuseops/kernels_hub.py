"""fuseops layers for Hugging Face's ``kernels`` package: transformers marks
layers it lets a kernel replace (``@use_kernel_forward_from_hub("RMSNorm")``
on Llama's, Qwen's, Mistral's, Mixtral's... RMSNorm), and
``kernels.kernelize(model, device=..., mode=...)`` swaps the forward of each
marked module for that of the layer a mapping names. ``kernel_mapping()``
maps the names fuseops has to its own layers, on CPU and CUDA, with no hub
download::

    from kernels import Mode, kernelize, use_kernel_mapping
    import fuseops.kernels_hub

    with use_kernel_mapping(fuseops.kernels_hub.kernel_mapping()):
        kernelize(model, device="cpu", mode=Mode.TRAINING)

Layers (``kernels``' rules: stateless, the replaced module's forward
signature, nothing but ``forward``, ``has_backward`` and
``can_torch_compile``):

- ``"RMSNorm"``: ``fuseops.rms_norm(x, weight, eps)`` with the module's
  ``weight`` and ``variance_epsilon`` (or ``eps``), the result in the wider
  of the input's and the weight's dtypes, as HF's RMSNorm returns it; with
  a backward, traceable by ``torch.compile``.

The rest of what ``fuseops.transformers.apply`` patches (rotary, MLP
activations, the fused LM head) is not marked for kernels by transformers'
Llama-style models, or is marked as a function rather than a layer: use
``apply`` for those.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The forward fuseops.transformers.apply gives RMSNorm modules: the same math.
from .transformers import _rms_norm_forward


class RMSNorm(torch.nn.Module):
    """``kernels`` layer for transformers' ``"RMSNorm"``: ``fuseops.rms_norm``."""

    has_backward = True
    can_torch_compile = True
    forward = _rms_norm_forward


_LAYERS: dict[str, type[torch.nn.Module]] = {"RMSNorm": RMSNorm}


@dataclass(frozen=True)
class LayerRepository:
    """A fuseops layer in ``kernels``' repository protocol (``load()``
    returns the layer class); nothing is downloaded."""

    layer_name: str

    def load(self) -> type[torch.nn.Module]:
        return _LAYERS[self.layer_name]


def kernel_mapping(devices: tuple[str, ...] = ("cpu", "cuda")) -> dict:
    """The mapping for ``kernels.use_kernel_mapping`` /
    ``register_kernel_mapping``: each fuseops layer on each of `devices`,
    for every mode (``Mode.FALLBACK``: the layers support training and
    ``torch.compile``)."""
    from kernels import Mode

    return {
        name: {device: {Mode.FALLBACK: LayerRepository(name)} for device in devices}
        for name in _LAYERS
    }


__all__ = ["LayerRepository", "RMSNorm", "kernel_mapping"]
