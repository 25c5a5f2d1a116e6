"""The registry behind ``fuseops.nn.replace_modules``: each fuseops module
declares, with ``@_replaces``, the torch.nn class it stands in for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch


# Replaced class (torch.nn's, or SwiGLUMLP) -> (fuseops class, predicate
# saying whether an instance's configuration is supported; None means always).
_REPLACEMENTS: dict[type, tuple[type, Optional[Callable[[torch.nn.Module], bool]]]] = {}


def _replaces(torch_cls: type, supported: Optional[Callable[[torch.nn.Module], bool]] = None):
    """Class decorator: the decorated fuseops module replaces `torch_cls`."""

    def register(cls: type) -> type:
        _REPLACEMENTS[torch_cls] = (cls, supported)
        return cls

    return register


@dataclass(frozen=True)
class Replacement:
    name: str  # qualified module name in the model
    old: str  # torch.nn class name
    new: str  # fuseops.nn class name


def _converted(module: torch.nn.Module, cls: type) -> torch.nn.Module:
    # A new instance sharing the old one's state (parameters, buffers, hooks,
    # training flag): optimizers holding those parameters keep working.
    new: torch.nn.Module = object.__new__(cls)
    new.__dict__ = module.__dict__.copy()
    return new


def replace_modules(model: torch.nn.Module) -> list[Replacement]:
    """Replaces, in place, every torch.nn module (and SwiGLUMLP) of `model`
    that fuseops has a drop-in for (exact type match, supported configuration), and returns what
    was replaced. `model` itself is never replaced, only its submodules."""
    replaced: list[Replacement] = []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            entry = _REPLACEMENTS.get(type(child))
            if entry is None:
                continue
            cls, supported = entry
            if supported is not None and not supported(child):
                continue
            setattr(parent, child_name, _converted(child, cls))
            qualified = f"{parent_name}.{child_name}" if parent_name else child_name
            replaced.append(Replacement(qualified, type(child).__name__, cls.__name__))
    return replaced
