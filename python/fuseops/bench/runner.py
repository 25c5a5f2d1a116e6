"""Runs the benchmark: for each case, dtype, shape and mode, checks fuseops
against a high-precision reference on the inputs it is timed on, then times
fuseops, its peers and a copy of the same bytes side by side."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

import torch

from . import timing
from .calls import (
    as_tuple,
    backward_call,
    copy_call,
    forward_call,
    fresh_grad_call,
    make_sets,
    native_out_call,
    out_call,
    resolve,
    rotating,
)
from .cases import Case
from .correctness import TOLERANCES, compare, expected
from .environment import cache_bytes
from .results import (
    BACKWARD_MODES,
    DEFAULT_MODES,
    FRESH_GRAD,
    MODE_LABELS,
    PEER_LABELS,
    PeerResult,
    Row,
)

MAKE_CALL = {
    "forward": forward_call,
    "forward+backward": backward_call,
    "out": out_call,
    FRESH_GRAD: fresh_grad_call,
}


@dataclass
class Config:
    cases: Sequence[Case]
    dtypes: Sequence[torch.dtype]
    shapes: Sequence[tuple[int, int]]
    modes: Sequence[str] = DEFAULT_MODES
    device: torch.device = torch.device("cpu")
    compile_peer: bool = True
    timer: timing.TimerSettings = field(default_factory=timing.TimerSettings)
    #: Where --profile writes one Chrome trace per row; None: no profiling.
    profile_dir: Optional[str] = None
    seed: int = 0
    #: The shape preset `shapes` came from, if any: it selects the cases'
    #: own shapes (Case.shapes).
    preset: Optional[str] = None
    #: Each case runs only the first of `modes` it has (the quick preset).
    first_mode_only: bool = False
    #: The bench preset the run was started with, recorded with the results.
    bench_preset: Optional[str] = None


def _input_set_count(bytes_per_call: int, cache: int) -> int:
    if bytes_per_call <= 0:
        return 1
    return max(1, min(8, math.ceil(2 * cache / bytes_per_call)))


class Runner:
    def __init__(self, config: Config, progress: Optional[Callable[[str], None]] = None):
        self.config = config
        self.progress = progress or (lambda description: None)
        self.cache_bytes = cache_bytes(config.device)

    def shapes(self, case: Case) -> Sequence[tuple[int, int]]:
        if case.shapes is not None and self.config.preset in case.shapes:
            return case.shapes[self.config.preset]
        return self.config.shapes

    def modes(self, case: Case) -> list[str]:
        modes = [
            m
            for m in self.config.modes
            if (m != "out" or case.has_out) and (m not in BACKWARD_MODES or case.differentiable)
        ]
        return modes[:1] if self.config.first_mode_only else modes

    def row_count(self) -> int:
        total = 0
        for case in self.config.cases:
            if resolve(case)[2]:
                total += 1
            else:
                total += len(self.config.dtypes) * len(self.shapes(case)) * len(self.modes(case))
        return total

    def run(self) -> Iterable[Row]:
        for case in self.config.cases:
            fuseops_fn, reference_fn, missing = resolve(case)
            if missing:
                self.progress(f"{case.name} not built")
                yield Row(op=case.name, family=case.family, status="not built", message=missing)
                continue
            for dtype in self.config.dtypes:
                for shape in self.shapes(case):
                    yield from self._run_group(case, fuseops_fn, reference_fn, dtype, shape)

    # One (case, dtype, shape): its modes share the compiled peer.
    def _run_group(self, case, fuseops_fn, reference_fn, dtype, shape) -> Iterable[Row]:
        config = self.config
        dtype_name = str(dtype).replace("torch.", "")
        shape_name = "x".join(map(str, shape))
        compiled_fn = None
        if config.compile_peer:
            # Each group compiles afresh, specialised to its shape and dtype,
            # so no peer runs a dynamic-shape kernel or hits the recompile limit.
            torch._dynamo.reset()
            compiled_fn = torch.compile(reference_fn, dynamic=False)
        element_size = torch.empty((), dtype=dtype).element_size()
        for mode in self.modes(case):
            self.progress(f"{case.name} {dtype_name} {shape_name} {MODE_LABELS[mode]}")
            row = Row(
                op=case.name, family=case.family, dtype=dtype_name, shape=shape_name, mode=mode
            )
            traffic = case.forward_traffic.bytes(*shape, element_size)
            if mode in BACKWARD_MODES:
                traffic += case.backward_traffic.bytes(*shape, element_size)
            row.bytes_moved = traffic
            row.tolerance = dict(zip(("rtol", "atol"), TOLERANCES[dtype]))
            try:
                self._run_row(row, case, fuseops_fn, reference_fn, compiled_fn, dtype, shape, mode)
            except Exception as error:  # reported in the row; the run goes on
                row.status = "ERROR"
                row.message = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            yield row

    def _run_row(
        self, row, case, fuseops_fn, reference_fn, compiled_fn, dtype, shape, mode
    ) -> None:
        config = self.config
        device = config.device
        row.input_sets = _input_set_count(row.bytes_moved, self.cache_bytes)
        sets = make_sets(case, dtype, shape, device, row.input_sets, config.seed)

        # Outputs of the forward pass give the shapes of grad_outputs and out=.
        with torch.no_grad():
            first = as_tuple(reference_fn(*sets[0].args, **case.options))
        for index, inputs in enumerate(sets):
            gen = torch.Generator(device=device).manual_seed(config.seed + 1000 + index)
            # Inference cases (nothing differentiable) may return integer
            # tensors, and need no gradients.
            inputs.grad_outputs = (
                tuple(
                    torch.randn(o.shape, dtype=o.dtype, device=device, generator=gen) for o in first
                )
                if case.differentiable
                else ()
            )
            inputs.outs = tuple(torch.empty_like(o) for o in first)
            if mode == FRESH_GRAD:
                inputs.refill_fresh_grads()

        make_call = MAKE_CALL[mode]
        want = expected(reference_fn, case, sets[0], mode, dtype)

        try:
            got = _once(make_call(fuseops_fn, case, sets[0]))
        except Exception as error:
            row.status = "ERROR"
            row.message = f"fuseops raised {type(error).__name__}: {error}".splitlines()[0][:300]
            return
        try:
            row.max_abs_err, row.error_ratio = compare(got, want, dtype)
        except AssertionError as error:
            row.status = "FAILED"
            row.message = f"wrong result: {error}"
            return
        del got

        # The peers, each called as it can be in this mode: an out= row
        # compares against the peers' allocating forward, except for native
        # ops that have an out= variant.
        peer_calls: dict[str, tuple[Callable, Callable]] = {}
        for name, fn in (
            ("eager", reference_fn),
            ("compiled", compiled_fn),
            ("native", case.native),
        ):
            if fn is None:
                continue
            label = case.native_label if name == "native" else PEER_LABELS[name]
            peer_make_call, variant = make_call, ""
            if mode == "out":
                if name == "native" and case.native_out is not None:
                    fn, peer_make_call, variant = case.native_out, native_out_call, "out="
                    label += " out="
                else:
                    peer_make_call, variant = forward_call, "allocating"
            peer = row.peers[name] = PeerResult(label=label, variant=variant)
            call = peer_make_call(fn, case, sets[0])
            try:
                start = time.perf_counter()
                got = call()
                peer.first_call_s = time.perf_counter() - start
                peer.max_abs_err = compare(got, want, dtype)[0]
            except Exception as error:  # a peer that cannot run is reported, not fatal
                peer.error = f"{type(error).__name__}: {error}".splitlines()[0][:300]
                continue
            finally:
                timing.refill(call)  # also after a failure, for the peers after it
            peer_calls[name] = (peer_make_call, fn)

        if not row.error_ratio <= 1.0:
            peer_errors = ", ".join(
                f"{peer.label} {peer.max_abs_err:.3g}"
                for peer in row.peers.values()
                if peer.max_abs_err is not None
            )
            row.status = "FAILED"
            row.message = (
                f"MISMATCH vs reference: max abs error {row.max_abs_err:.3g} is "
                f"{row.error_ratio:.3g}x the allowed error (rtol {row.tolerance['rtol']:g}, "
                f"atol {row.tolerance['atol']:g} x max|reference|)"
                + (f"; the peers' errors: {peer_errors}" if peer_errors else "")
            )
            return

        timed = {"fuseops": rotating(make_call, fuseops_fn, case, sets)}
        for name, (peer_make_call, fn) in peer_calls.items():
            timed[name] = rotating(peer_make_call, fn, case, sets)
        timed["copy"] = copy_call(row.bytes_moved, row.input_sets, config.device)
        timings = timing.measure_many(timed, device, config.timer)
        row.time, row.copy_time = timings["fuseops"], timings["copy"]
        memory = timing.memory_use(make_call(fuseops_fn, case, sets[0]), device)
        row.peak_bytes, row.allocated_bytes = memory.peak, memory.allocated
        for name, (peer_make_call, fn) in peer_calls.items():
            row.peers[name].time = timings[name]
            memory = timing.memory_use(peer_make_call(fn, case, sets[0]), device)
            row.peers[name].peak_bytes = memory.peak
            row.peers[name].allocated_bytes = memory.allocated

        if config.profile_dir:
            calls = {"fuseops": make_call(fuseops_fn, case, sets[0])}
            for name, (peer_make_call, fn) in peer_calls.items():
                calls[name] = peer_make_call(fn, case, sets[0])
            row.trace = self._profile(row, calls)

    def _profile(self, row: Row, calls: dict[str, Callable]) -> str:
        from torch.profiler import ProfilerActivity, profile, record_function

        activities = [ProfilerActivity.CPU]
        if self.config.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities, profile_memory=True, record_shapes=True)
        with timing.quiet_stderr():
            prof.start()
        try:
            for impl, call in calls.items():
                for _ in range(3):
                    with record_function(f"{row.op} {row.mode} [{impl}]"):
                        call()
                    timing.refill(call)
        finally:
            with timing.quiet_stderr():
                prof.stop()
        name = f"{row.op}-{row.dtype}-{row.shape}-{row.mode.replace('+', '_')}"
        assert self.config.profile_dir is not None  # profile() runs only with one
        os.makedirs(self.config.profile_dir, exist_ok=True)
        path = os.path.join(self.config.profile_dir, f"{name}.json")
        prof.export_chrome_trace(path)
        with open(os.path.join(self.config.profile_dir, f"{name}.txt"), "w") as f:
            f.write(prof.key_averages().table(sort_by="self_cpu_memory_usage", row_limit=25))
        return path


def _once(call: Callable[[], tuple]) -> tuple:
    """One call outside the timing, its consumed inputs prepared again."""
    result = call()
    timing.refill(call)
    return result


__all__ = ["Config", "Runner"]
