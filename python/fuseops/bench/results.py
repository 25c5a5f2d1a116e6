"""What the benchmark measures for one row (op, dtype, shape, mode) and for
each of its peers, and how each becomes a JSON record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from . import timing

#: Forward and backward with the upstream gradient handed over as training
#: hands it: a fresh tensor nothing else refers to (calls.fresh_grad_call).
FRESH_GRAD = "forward+backward-fresh-grad"
MODES = ("forward", "forward+backward", "out", FRESH_GRAD)
#: What runs unless --modes says otherwise.
DEFAULT_MODES = ("forward", "forward+backward", "out")
#: Modes that run the backward (left out for inference cases).
BACKWARD_MODES = ("forward+backward", FRESH_GRAD)
MODE_LABELS = {
    "forward": "fwd",
    "forward+backward": "fwd+bwd",
    "out": "fwd out=",
    FRESH_GRAD: "fwd+bwd fresh grad",
}
PEERS = ("eager", "compiled", "native")
PEER_LABELS = {
    "eager": "eager reference",
    "compiled": "torch.compile(reference)",
    "native": "native PyTorch op",
}


@dataclass
class PeerResult:
    label: str
    time: Optional[timing.Timing] = None
    peak_bytes: Optional[int] = None
    #: Bytes of all the allocations of one call, however soon freed.
    allocated_bytes: Optional[int] = None
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
            "allocated_bytes": self.allocated_bytes,
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
    allocated_bytes: Optional[int] = None
    bytes_moved: Optional[int] = None
    copy_time: Optional[timing.Timing] = None
    max_abs_err: Optional[float] = None
    #: Worst elementwise error as a fraction of the allowed error (<= 1 passes).
    error_ratio: Optional[float] = None
    tolerance: Optional[dict] = None
    input_sets: int = 1
    peers: dict = field(default_factory=dict)
    trace: str = ""
    #: The op module that registers the case (Case.family).
    family: str = ""

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
            "family": self.family,
            "dtype": self.dtype,
            "shape": self.shape,
            "mode": self.mode,
            "status": self.status,
            "message": self.message,
            "time": self.time.as_dict() if self.time else None,
            "peak_bytes": self.peak_bytes,
            "allocated_bytes": self.allocated_bytes,
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
