"""Runs the benchmark: for each case, dtype, shape and mode, checks fuseops
against a high-precision reference on the inputs it is timed on, then times
fuseops, its peers and a copy of the same bytes side by side."""

from __future__ import annotations

import itertools
import math
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

import torch

from . import timing
from .cases import Case

MODES = ("forward", "forward+backward", "out")
MODE_LABELS = {"forward": "fwd", "forward+backward": "fwd+bwd", "out": "fwd out="}
PEERS = ("eager", "compiled", "native")
PEER_LABELS = {
    "eager": "eager reference",
    "compiled": "torch.compile(reference)",
    "native": "native PyTorch op",
}

# Allowed error of fuseops against the reference, per dtype (rtol, atol):
# |got - want| <= atol * max(1, max|want|) + rtol * |want| elementwise. atol
# scales with the tensor's largest value, so that elements near zero (which
# cancellation in a row reduction makes inexact in any float32 code) and
# weight gradients summed over thousands of rows are judged at their tensor's
# scale. float32 is compared with a float64 reference; bfloat16/float16 with a
# float32-computed reference rounded to the dtype, allowing about two units in
# the last place.
TOLERANCES = {
    torch.float64: (1e-9, 1e-12),
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (2e-2, 1e-2),
    torch.float16: (4e-3, 1e-3),
}


@dataclass
class Config:
    cases: Sequence[Case]
    dtypes: Sequence[torch.dtype]
    shapes: Sequence[tuple[int, int]]
    modes: Sequence[str] = MODES
    device: torch.device = torch.device("cpu")
    compile_peer: bool = True
    timer: timing.TimerSettings = field(default_factory=timing.TimerSettings)
    #: Where --profile writes one Chrome trace per row; None: no profiling.
    profile_dir: Optional[str] = None
    seed: int = 0


@dataclass
class PeerResult:
    label: str
    time: Optional[timing.Timing] = None
    peak_bytes: Optional[int] = None
    max_abs_err: Optional[float] = None
    #: "allocating" when an `out=` row's peer can only allocate its output.
    variant: str = ""
    error: str = ""
    #: Seconds of the first call (for torch.compile, mostly compilation).
    first_call_s: Optional[float] = None

    def as_dict(self, fuseops_time: Optional[float]) -> dict:
        speedup = None
        if self.time is not None and fuseops_time:
            speedup = self.time.median_s / fuseops_time
        return {
            "label": self.label,
            "time": self.time.as_dict() if self.time else None,
            "speedup": speedup,
            "peak_bytes": self.peak_bytes,
            "max_abs_err": self.max_abs_err,
            "variant": self.variant,
            "error": self.error,
            "first_call_s": self.first_call_s,
        }


@dataclass
class Row:
    op: str
    dtype: str = ""
    shape: str = ""
    mode: str = ""
    status: str = "ok"  # ok | FAILED | ERROR | not built
    message: str = ""
    time: Optional[timing.Timing] = None
    peak_bytes: Optional[int] = None
    bytes_moved: Optional[int] = None
    copy_time: Optional[timing.Timing] = None
    max_abs_err: Optional[float] = None
    #: Worst elementwise error as a fraction of the allowed error (<= 1 passes).
    error_ratio: Optional[float] = None
    tolerance: Optional[dict] = None
    input_sets: int = 1
    peers: dict = field(default_factory=dict)
    trace: str = ""

    @property
    def gbps(self) -> Optional[float]:
        if self.time is None or not self.bytes_moved:
            return None
        return self.bytes_moved / self.time.median_s / 1e9

    @property
    def copy_gbps(self) -> Optional[float]:
        if self.copy_time is None or not self.bytes_moved:
            return None
        return self.bytes_moved / self.copy_time.median_s / 1e9

    @property
    def roofline_fraction(self) -> Optional[float]:
        if self.time is None or self.copy_time is None:
            return None
        return self.copy_time.median_s / self.time.median_s

    def speedup(self, peer: str) -> Optional[float]:
        result = self.peers.get(peer)
        if result is None or result.time is None or self.time is None:
            return None
        return result.time.median_s / self.time.median_s

    def as_dict(self) -> dict:
        fuseops_time = self.time.median_s if self.time else None
        return {
            "op": self.op,
            "dtype": self.dtype,
            "shape": self.shape,
            "mode": self.mode,
            "status": self.status,
            "message": self.message,
            "time": self.time.as_dict() if self.time else None,
            "peak_bytes": self.peak_bytes,
            "bytes_moved": self.bytes_moved,
            "gbps": self.gbps,
            "copy_time": self.copy_time.as_dict() if self.copy_time else None,
            "copy_gbps": self.copy_gbps,
            "roofline_fraction": self.roofline_fraction,
            "max_abs_err": self.max_abs_err,
            "error_ratio": self.error_ratio,
            "tolerance": self.tolerance,
            "input_sets": self.input_sets,
            "peers": {name: peer.as_dict(fuseops_time) for name, peer in self.peers.items()},
            "trace": self.trace,
        }


# ---------------------------------------------------------------------------
# Environment


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
        "compile_peer": config.compile_peer,
        "load_average_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "timer": {
            "min_time_s": config.timer.min_time,
            "min_blocks": config.timer.min_blocks,
            "block_time_s": config.timer.block_time,
            "warmup_calls": config.timer.warmup_calls,
        },
        "method": {
            "timing": timing.__doc__.split("\n\n")[1].replace("\n", " "),
            "peak_memory": timing.__doc__.split("\n\n")[2].replace("\n", " "),
            "tolerance": "|got - want| <= atol * max(1, max|want|) + rtol * |want|; want is "
            "the reference computed in float64 (float32/float64 inputs) or in float32 and "
            "rounded to the dtype (bfloat16/float16 inputs)",
            "bytes_moved": "each input read once and each output written once, at the least",
            "roofline": "a tensor copy moving the same number of bytes, timed in the same run",
        },
    }
    if config.device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(config.device)
        env["gpu_l2_cache_bytes"] = cache_bytes(config.device)
    return env


# ---------------------------------------------------------------------------
# Calling an op in each mode


def _as_tuple(result) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _resolve(case: Case) -> tuple[Optional[Callable], Optional[Callable], str]:
    import fuseops
    import fuseops.reference

    fuseops_fn = case.fuseops if callable(case.fuseops) else getattr(fuseops, case.fuseops, None)
    reference_fn = (
        case.reference
        if callable(case.reference)
        else getattr(fuseops.reference, case.reference, None)
    )
    missing = []
    if fuseops_fn is None:
        missing.append(f"fuseops.{case.fuseops} is not in the installed fuseops")
    if reference_fn is None:
        missing.append(f"fuseops.reference.{case.reference} is missing")
    return fuseops_fn, reference_fn, "; ".join(missing)


@dataclass
class InputSet:
    args: tuple
    grad_args: tuple  # the same values, as leaves that require grad
    grad_outputs: tuple = ()
    outs: tuple = ()


def _forward_call(fn: Callable, case: Case, inputs: InputSet) -> Callable[[], tuple]:
    return lambda: _as_tuple(fn(*inputs.args, **case.options))


def _backward_call(fn: Callable, case: Case, inputs: InputSet) -> Callable[[], tuple]:
    wrt = tuple(inputs.grad_args[i] for i in case.differentiable)

    def call():
        outputs = _as_tuple(fn(*inputs.grad_args, **case.options))
        grads = torch.autograd.grad(outputs, wrt, inputs.grad_outputs)
        return tuple(o.detach() for o in outputs) + tuple(grads)

    return call


def _out_call(fn: Callable, case: Case, inputs: InputSet) -> Callable[[], tuple]:
    def call():
        case.call_out(fn, inputs.args, case.options, inputs.outs)
        return inputs.outs

    return call


def _native_out_call(fn: Callable, case: Case, inputs: InputSet) -> Callable[[], tuple]:
    def call():
        fn(*inputs.args, **case.options, out=inputs.outs[0])
        return inputs.outs

    return call


def _rotating(make_call, fn: Callable, case: Case, sets: Sequence[InputSet]) -> Callable:
    """One call per input set, in turn: with sets that together exceed twice
    the cache, every call reads its inputs from memory."""
    calls = itertools.cycle([make_call(fn, case, inputs) for inputs in sets])
    return lambda: next(calls)()


# ---------------------------------------------------------------------------
# Correctness


def _expected(reference_fn: Callable, case: Case, inputs: InputSet, mode: str, dtype) -> tuple:
    """The reference result in high precision: float64 for float32/float64
    inputs, float32 rounded to the dtype for bfloat16/float16."""
    compute = torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32
    args = tuple(a.detach().to(compute) for a in inputs.args)
    if mode == "forward+backward":
        args = tuple(a.requires_grad_() for a in args)
        outputs = _as_tuple(reference_fn(*args, **case.options))
        grad_outputs = tuple(g.to(compute) for g in inputs.grad_outputs)
        wrt = tuple(args[i] for i in case.differentiable)
        grads = torch.autograd.grad(outputs, wrt, grad_outputs)
        result = tuple(o.detach() for o in outputs) + tuple(grads)
    else:
        with torch.no_grad():
            result = _as_tuple(reference_fn(*args, **case.options))
    return tuple(r.to(dtype).to(compute) for r in result)


def _compare(got: tuple, want: tuple, dtype) -> tuple[float, float]:
    """(max abs error, worst error / allowed error) over all result tensors."""
    if len(got) != len(want):
        raise AssertionError(f"returned {len(got)} tensors, the reference {len(want)}")
    rtol, atol = TOLERANCES[dtype]
    max_err = worst = 0.0
    for g, w in zip(got, want):
        if tuple(g.shape) != tuple(w.shape):
            raise AssertionError(f"shape {tuple(g.shape)}, the reference {tuple(w.shape)}")
        g = g.detach().to(w.dtype)
        w_nan = torch.isnan(w)
        if not torch.equal(torch.isnan(g), w_nan):
            return math.inf, math.inf
        if w.numel() == 0:
            continue
        w_abs = w.abs().nan_to_num_(nan=0.0)
        diff = (g - w).abs_().masked_fill_(w_nan, 0.0)
        scale = max(1.0, w_abs.max().item())
        allowed = w_abs.mul_(rtol).add_(atol * scale)
        max_err = max(max_err, diff.max().item())
        worst = max(worst, diff.div_(allowed).max().item())
    return max_err, worst


# ---------------------------------------------------------------------------
# Running


def _make_sets(case: Case, dtype, shape, device, count: int, seed: int) -> list[InputSet]:
    rows, hidden = shape
    sets = []
    for index in range(count):
        gen = torch.Generator(device=device).manual_seed(seed + index)
        args = case.make_inputs(rows, hidden, dtype, device, gen)
        grad_args = tuple(
            a.detach().clone().requires_grad_(i in case.differentiable)
            for i, a in enumerate(args)
        )
        sets.append(InputSet(args=args, grad_args=grad_args))
    return sets


def _input_set_count(bytes_per_call: int, cache: int) -> int:
    if bytes_per_call <= 0:
        return 1
    return max(1, min(8, math.ceil(2 * cache / bytes_per_call)))


def cache_bytes(device: torch.device) -> int:
    """The largest cache in front of `device`'s memory: the CPU's last-level
    cache, or the GPU's L2."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).L2_cache_size
    return last_level_cache_bytes()


class Runner:
    def __init__(self, config: Config, progress: Optional[Callable[[str], None]] = None):
        self.config = config
        self.progress = progress or (lambda description: None)
        self.cache_bytes = cache_bytes(config.device)

    def row_count(self) -> int:
        total = 0
        for case in self.config.cases:
            if _resolve(case)[2]:
                total += 1
            else:
                modes = [m for m in self.config.modes if m != "out" or case.has_out]
                total += len(self.config.dtypes) * len(self.config.shapes) * len(modes)
        return total

    def run(self) -> Iterable[Row]:
        for case in self.config.cases:
            fuseops_fn, reference_fn, missing = _resolve(case)
            if missing:
                self.progress(f"{case.name} not built")
                yield Row(op=case.name, status="not built", message=missing)
                continue
            for dtype in self.config.dtypes:
                for shape in self.config.shapes:
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
        modes = [m for m in config.modes if m != "out" or case.has_out]
        for mode in modes:
            self.progress(f"{case.name} {dtype_name} {shape_name} {MODE_LABELS[mode]}")
            row = Row(op=case.name, dtype=dtype_name, shape=shape_name, mode=mode)
            traffic = case.forward_traffic.bytes(*shape, element_size)
            if mode == "forward+backward":
                traffic += case.backward_traffic.bytes(*shape, element_size)
            row.bytes_moved = traffic
            row.tolerance = dict(zip(("rtol", "atol"), TOLERANCES[dtype]))
            try:
                self._run_row(row, case, fuseops_fn, reference_fn, compiled_fn, dtype, shape,
                              mode)
            except Exception as error:  # reported in the row; the run goes on
                row.status = "ERROR"
                row.message = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            yield row

    def _run_row(self, row, case, fuseops_fn, reference_fn, compiled_fn, dtype, shape,
                 mode) -> None:
        config = self.config
        device = config.device
        row.input_sets = _input_set_count(row.bytes_moved, self.cache_bytes)
        sets = _make_sets(case, dtype, shape, device, row.input_sets, config.seed)

        # Outputs of the forward pass give the shapes of grad_outputs and out=.
        with torch.no_grad():
            first = _as_tuple(reference_fn(*sets[0].args, **case.options))
        for index, inputs in enumerate(sets):
            gen = torch.Generator(device=device).manual_seed(config.seed + 1000 + index)
            inputs.grad_outputs = tuple(
                torch.randn(o.shape, dtype=o.dtype, device=device, generator=gen) for o in first
            )
            inputs.outs = tuple(torch.empty_like(o) for o in first)

        make_call = {"forward": _forward_call, "forward+backward": _backward_call,
                     "out": _out_call}[mode]
        want = _expected(reference_fn, case, sets[0], mode, dtype)

        try:
            got = make_call(fuseops_fn, case, sets[0])()
        except Exception as error:
            row.status = "ERROR"
            row.message = f"fuseops raised {type(error).__name__}: {error}".splitlines()[0][:300]
            return
        try:
            row.max_abs_err, row.error_ratio = _compare(got, want, dtype)
        except AssertionError as error:
            row.status = "FAILED"
            row.message = f"wrong result: {error}"
            return
        del got

        # The peers, each called as it can be in this mode: an out= row
        # compares against the peers' allocating forward, except for native
        # ops that have an out= variant.
        peer_calls: dict[str, tuple[Callable, Callable]] = {}
        for name, fn in (("eager", reference_fn), ("compiled", compiled_fn),
                         ("native", case.native)):
            if fn is None:
                continue
            label = case.native_label if name == "native" else PEER_LABELS[name]
            peer_make_call, variant = make_call, ""
            if mode == "out":
                if name == "native" and case.native_out is not None:
                    fn, peer_make_call, variant = case.native_out, _native_out_call, "out="
                    label += " out="
                else:
                    peer_make_call, variant = _forward_call, "allocating"
            peer = row.peers[name] = PeerResult(label=label, variant=variant)
            try:
                start = time.perf_counter()
                got = peer_make_call(fn, case, sets[0])()
                peer.first_call_s = time.perf_counter() - start
                peer.max_abs_err = _compare(got, want, dtype)[0]
            except Exception as error:  # a peer that cannot run is reported, not fatal
                peer.error = f"{type(error).__name__}: {error}".splitlines()[0][:300]
                continue
            peer_calls[name] = (peer_make_call, fn)

        if not row.error_ratio <= 1.0:
            peer_errors = ", ".join(f"{peer.label} {peer.max_abs_err:.3g}"
                                    for peer in row.peers.values() if peer.max_abs_err is not None)
            row.status = "FAILED"
            row.message = (
                f"MISMATCH vs reference: max abs error {row.max_abs_err:.3g} is "
                f"{row.error_ratio:.3g}x the allowed error (rtol {row.tolerance['rtol']:g}, "
                f"atol {row.tolerance['atol']:g} x max|reference|)"
                + (f"; the peers' errors: {peer_errors}" if peer_errors else "")
            )
            return

        timed = {"fuseops": _rotating(make_call, fuseops_fn, case, sets)}
        for name, (peer_make_call, fn) in peer_calls.items():
            timed[name] = _rotating(peer_make_call, fn, case, sets)
        timed["copy"] = self._copy_call(row.bytes_moved, row.input_sets)
        timings = timing.measure_many(timed, device, config.timer)
        row.time, row.copy_time = timings["fuseops"], timings["copy"]
        row.peak_bytes = timing.peak_memory(make_call(fuseops_fn, case, sets[0]), device)
        for name, (peer_make_call, fn) in peer_calls.items():
            row.peers[name].time = timings[name]
            row.peers[name].peak_bytes = timing.peak_memory(
                peer_make_call(fn, case, sets[0]), device)

        if config.profile_dir:
            calls = {"fuseops": make_call(fuseops_fn, case, sets[0])}
            for name, (peer_make_call, fn) in peer_calls.items():
                calls[name] = peer_make_call(fn, case, sets[0])
            row.trace = self._profile(row, calls)

    def _copy_call(self, bytes_moved: int, set_count: int) -> Callable[[], object]:
        """A copy reading and writing `bytes_moved` bytes in all, on the same
        device, rotating through as many buffers as the op's input sets."""
        numel = max(1, bytes_moved // 8)  # float32: 4 bytes read + 4 written
        device = self.config.device
        pairs = [
            (torch.randn(numel, device=device), torch.empty(numel, device=device))
            for _ in range(set_count)
        ]
        for src, dst in pairs:
            dst.copy_(src)  # first touch of dst outside the timing
        calls = itertools.cycle([lambda s=s, d=d: d.copy_(s) for s, d in pairs])
        return lambda: next(calls)()

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
        finally:
            with timing.quiet_stderr():
                prof.stop()
        name = f"{row.op}-{row.dtype}-{row.shape}-{row.mode.replace('+', '_')}"
        os.makedirs(self.config.profile_dir, exist_ok=True)
        path = os.path.join(self.config.profile_dir, f"{name}.json")
        prof.export_chrome_trace(path)
        with open(os.path.join(self.config.profile_dir, f"{name}.txt"), "w") as f:
            f.write(prof.key_averages().table(sort_by="self_cpu_memory_usage", row_limit=25))
        return path


def check_device(device: torch.device) -> Optional[str]:
    """Why `device` cannot be benchmarked here, or None if it can."""
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        return f"unsupported device {device}: use cpu or cuda"
    if torch.version.cuda is None:
        return (f"no CUDA here: this torch ({torch.__version__}) is a CPU-only build, "
                "so there is nothing to benchmark on --device cuda")
    if not torch.cuda.is_available():
        return f"no CUDA device found (torch {torch.__version__}, CUDA {torch.version.cuda})"
    import fuseops

    if not fuseops.build_info()["cuda"]:
        return "this fuseops was built without CUDA kernels (see python -m fuseops info)"
    return None


__all__ = ["Config", "MODES", "MODE_LABELS", "PEERS", "Row", "Runner", "check_device",
           "environment"]
