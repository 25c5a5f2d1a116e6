"""The dtypes and devices the tests are parametrized over."""

from __future__ import annotations

import torch

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]

#: Every device tests run on: the CPU, and CUDA where this machine has it (no
#: CUDA parameter exists elsewhere, rather than one that is skipped).
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
