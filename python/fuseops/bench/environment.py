"""The machine the benchmark runs on: whether a device can be benchmarked,
its caches, and the environment and method recorded beside the results."""

from __future__ import annotations

import datetime
import os
import platform
from typing import TYPE_CHECKING, Optional

import torch

from . import timing
from .calls import FRESH_GRAD_METHOD, ROOFLINE_METHOD
from .cases import TRAFFIC_METHOD
from .correctness import TOLERANCE_METHOD

if TYPE_CHECKING:
    from .runner import Config


def last_level_cache_bytes() -> int:
    """Size of the largest CPU cache (sysfs), or 32 MiB when unknown."""
    largest = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            try:
                with open(os.path.join(base, entry, "size")) as f:
                    text = f.read().strip()
            except OSError:
                continue
            units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
            value = int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
            largest = max(largest, value)
    except (OSError, ValueError):
        pass
    return largest or 32 << 20


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_bytes(device: torch.device) -> int:
    """The largest cache in front of `device`'s memory: the CPU's last-level
    cache, or the GPU's L2."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).L2_cache_size
    return last_level_cache_bytes()


def check_device(device: torch.device) -> Optional[str]:
    """Why `device` cannot be benchmarked here, or None if it can."""
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        return f"unsupported device {device}: use cpu or cuda"
    if torch.version.cuda is None:
        return (
            f"no CUDA here: this torch ({torch.__version__}) is a CPU-only build, "
            "so there is nothing to benchmark on --device cuda"
        )
    if not torch.cuda.is_available():
        return f"no CUDA device found (torch {torch.__version__}, CUDA {torch.version.cuda})"
    import fuseops

    if not fuseops.build_info()["cuda"]:
        return "this fuseops was built without CUDA kernels (see python -m fuseops info)"
    return None


def environment(config: Config) -> dict:
    import fuseops

    info = fuseops.build_info()
    env = {
        "fuseops_version": fuseops.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "device": str(config.device),
        "threads": torch.get_num_threads(),
        "logical_cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "last_level_cache_bytes": last_level_cache_bytes(),
        "fuseops_cpu_capability": info["selected_cpu_capability"],
        "fuseops_cpu_builds": list(info["cpu_capabilities"]),
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "preset": config.bench_preset,
        "compile_peer": config.compile_peer,
        "load_average_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        # When the run started: UTC, ISO 8601.
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "timer": {
            "min_time_s": config.timer.min_time,
            "min_blocks": config.timer.min_blocks,
            "block_time_s": config.timer.block_time,
            "warmup_calls": config.timer.warmup_calls,
        },
        "method": {
            "timing": timing.TIMING_METHOD,
            "peak_memory": timing.PEAK_MEMORY_METHOD,
            "allocated_bytes": timing.ALLOCATED_METHOD,
            "fresh_grad": FRESH_GRAD_METHOD,
            "tolerance": TOLERANCE_METHOD,
            "bytes_moved": TRAFFIC_METHOD,
            "roofline": ROOFLINE_METHOD,
        },
    }
    if config.device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(config.device)
        env["gpu_l2_cache_bytes"] = cache_bytes(config.device)
    return env
