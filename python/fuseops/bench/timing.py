"""Timing and peak-memory measurement for the benchmark; the methods are
described in TIMING_METHOD and PEAK_MEMORY_METHOD, which bench.json repeats."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

TIMING_METHOD = (
    "Timing: a few warm-up calls, then a block size chosen so that one block lasts at least "
    "`block_time`; then fuseops, its peers and the copy take turns, one block each per round, "
    "until each has `min_blocks` blocks and `min_time` seconds. Each block's time divided by "
    "its call count is one sample; the median is the figure, the interquartile range its "
    "spread. CPU blocks are timed with `time.perf_counter`; CUDA blocks with CUDA events on "
    "the current stream. A call that consumes a prepared input (the fresh upstream gradient "
    "of the fwd+bwd fresh grad rows) is timed call by call, its input prepared again after "
    "each call outside the timed region; the block's time is the sum of its calls' times."
)
PEAK_MEMORY_METHOD = (
    "Peak memory: the most memory allocated at any moment during one call, above what was "
    "allocated before it (so inputs do not count; outputs, saved activations, gradients and "
    "temporaries do). On CUDA this is `torch.cuda.max_memory_allocated`; on CPU, where "
    "PyTorch keeps no such counter, one call runs under `torch.profiler` with "
    "`profile_memory=True` and the allocation and free events it records (every allocation "
    "through c10's CPU allocator, i.e. every tensor) are summed in time order."
)
ALLOCATED_METHOD = (
    "Allocated bytes: the sum of the sizes of all allocations made during one call, however "
    "soon freed (inputs, and a fresh upstream gradient handed over to the call, were allocated "
    "before it and do not count). On CUDA the delta of `torch.cuda.memory_stats()`'s "
    "`allocated_bytes.all.allocated`; on CPU the allocation events of the same profiler run "
    "as the peak."
)


@dataclass(frozen=True)
class Timing:
    median_s: float
    iqr_s: float
    samples: int
    calls: int

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return self.iqr_s / self.median_s if self.median_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "median_s": self.median_s,
            "iqr_s": self.iqr_s,
            "samples": self.samples,
            "calls": self.calls,
        }


@dataclass(frozen=True)
class TimerSettings:
    min_time: float = 0.05
    min_blocks: int = 7
    block_time: float = 0.005
    # The calibration blocks after these warm up further.
    warmup_calls: int = 1


def refill(fn: Callable[[], object]) -> None:
    """Prepares again what the last call of `fn` consumed, if anything
    (`fn.refill`, outside any timed region)."""
    prepare = getattr(fn, "refill", None)
    if prepare is not None:
        prepare()


def call_untimed(fn: Callable[[], object]) -> None:
    fn()
    refill(fn)


def _block_timer(device: torch.device) -> Callable[[Callable[[], object], int], float]:
    if device.type == "cuda":

        def run_cuda_block(fn, number):
            if hasattr(fn, "refill"):
                # One pair of events per call; the refill is queued after
                # the call's end event, outside what is timed.
                events = []
                for _ in range(number):
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                    fn()
                    end.record()
                    events.append((start, end))
                    fn.refill()
                torch.cuda.synchronize()
                return sum(start.elapsed_time(end) for start, end in events) / 1e3
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(number):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3

        return run_cuda_block

    def run_block(fn, number):
        if hasattr(fn, "refill"):
            total = 0.0
            for _ in range(number):
                start = time.perf_counter()
                fn()  # its result is dropped inside the timed region, as below
                total += time.perf_counter() - start
                fn.refill()
            return total
        start = time.perf_counter()
        for _ in range(number):
            fn()
        return time.perf_counter() - start

    return run_block


def _calibrate(run_block, fn, settings: TimerSettings) -> tuple[int, float]:
    """(calls per block, seconds of the last block): the block grows until it
    lasts block_time, so short ops get many calls per sample and timer
    overhead and clock resolution stay negligible."""
    number = 1
    while True:
        elapsed = run_block(fn, number)
        if elapsed >= settings.block_time or number >= 1 << 20:
            return number, elapsed
        number *= max(2, min(10, int(settings.block_time / max(elapsed, 1e-9)) + 1))


def measure_many(
    fns: dict[str, Callable[[], object]], device: torch.device, settings: TimerSettings
) -> dict[str, Timing]:
    """Times several callables side by side: after warm-up and calibration
    they take turns, one block each per round, until every one has
    `min_blocks` samples and `min_time` seconds. Whatever else the machine
    does during the run then slows them alike, and their ratios stay fair."""
    run_block = _block_timer(device)
    numbers: dict[str, int] = {}
    samples: dict[str, list[float]] = {}
    totals: dict[str, float] = {}
    for name, fn in fns.items():
        # At least one call of each input set of a rotating callable.
        for _ in range(max(settings.warmup_calls, getattr(fn, "cycle", 1))):
            call_untimed(fn)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        numbers[name], elapsed = _calibrate(run_block, fn, settings)
        samples[name] = [elapsed / numbers[name]]
        totals[name] = elapsed

    def wanting() -> bool:
        return any(
            len(samples[name]) < settings.min_blocks or totals[name] < settings.min_time
            for name in fns
        )

    while wanting():
        for name, fn in fns.items():
            elapsed = run_block(fn, numbers[name])
            samples[name].append(elapsed / numbers[name])
            totals[name] += elapsed
    results = {}
    for name, values in samples.items():
        quartiles = statistics.quantiles(values, n=4, method="inclusive")
        results[name] = Timing(
            median_s=statistics.median(values),
            iqr_s=quartiles[2] - quartiles[0],
            samples=len(values),
            calls=len(values) * numbers[name],
        )
    return results


def measure(fn: Callable[[], object], device: torch.device, settings: TimerSettings) -> Timing:
    return measure_many({"fn": fn}, device, settings)["fn"]


@contextlib.contextmanager
def quiet_stderr():
    """Silences file descriptor 2, where the profiler's C++ side prints a
    line each time it starts and stops."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@dataclass(frozen=True)
class MemoryUse:
    #: The most bytes allocated at any moment of the call, above the level before it.
    peak: int
    #: The sum of all allocations during the call, however soon freed.
    allocated: int


def peak_memory(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated during one call of `fn` above the level before it."""
    return memory_use(fn, device).peak


def memory_use(fn: Callable[[], object], device: torch.device) -> MemoryUse:
    """Peak and total bytes allocated during one call of `fn`.

    Whatever `fn` returns is kept alive until the call is over, as a caller
    holding the result would. What the call consumed is prepared again
    afterwards (`refill`), outside the measurement."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        allocated_before = torch.cuda.memory_stats(device).get("allocated_bytes.all.allocated", 0)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        allocated = (
            torch.cuda.memory_stats(device).get("allocated_bytes.all.allocated", 0)
            - allocated_before
        )
        del result
        refill(fn)
        return MemoryUse(peak=max(peak, 0), allocated=allocated)

    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    # Quiet during the call too: freeing memory allocated before the
    # profiler started (a fresh upstream gradient, which the call consumes)
    # makes c10 warn that the profiler does not see that free. Neither the
    # peak nor the allocations count it, as intended.
    with quiet_stderr():
        prof.start()
        try:
            result = fn()
            del result
        finally:
            prof.stop()
    refill(fn)
    # Every allocation and free, in time order. (prof.events() would fold
    # allocations made inside an op into that op's totals.)
    events = sorted(
        (
            event
            for event in prof.profiler.kineto_results.events()
            if event.name() == "[memory]" and event.device_type() == DeviceType.CPU
        ),
        key=lambda event: event.start_ns(),
    )
    level = peak = allocated = 0
    for event in events:
        level += event.nbytes()
        peak = max(peak, level)
        allocated += max(event.nbytes(), 0)
    return MemoryUse(peak=peak, allocated=allocated)
