"""``python -m fuseops bench --executorch`` and ``--onnx``: the deployed
programs of a Hugging Face Llama patched by ``fuseops.transformers.apply``,
float and quantized: each program file's size, the time of one forward (the
logits of a prompt, no cache) in the deployment runtime and in PyTorch on
the same machine, and how far the program's logits are from PyTorch's
(TIMING_METHOD).

The model is the ``--decode`` run's (``--executorch-size``/``--onnx-size``:
random weights from a config, float32), quantized by ``apply(quantize=...)``
or, for the 2:4 modes that apply does not take, by ``fuseops.quantize_``
after ``apply``, and exported by the runtime's fuseops exporter:

- ``--executorch``: :func:`fuseops.executorch.export` to a ``.pte`` run by
  ExecuTorch's runtime (fuseops' ops decomposed to ATen, XNNPACK's
  partitioner where ExecuTorch has it). A quantized model keeps its packed
  int8/int4 weights in the program and dequantizes them in the graph: the
  file is smaller; the forward is what ExecuTorch's kernels make of that
  graph. A variant named ``<mode>+fuseops`` (``w8a16+fuseops``) is exported
  with ``kernels="fuseops"`` instead: the fuseops ops stay in the program
  and fuseops' own kernels run them (:func:`fuseops.executorch.load_kernels`).
- ``--onnx``: :func:`fuseops.onnx.export` to a ``.onnx`` file run by ONNX
  Runtime's CPU provider (with the process's thread count), whose session
  is made before the timing: its graph optimizations, which fold the
  dequantization of constant weights, are not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from . import decode

DEFAULT_SIZE = "small"
DEFAULT_PROMPT = 32
DEFAULT_REPEATS = 3
#: The suffix of an ExecuTorch variant whose program runs fuseops' kernels.
FUSEOPS_KERNELS = "+fuseops"
_MODES = ("float32", "w8a16", "w8a8", "w4a16", "w4a8", "2:4", "2:4+w8a16", "2:4+w8a8")


@dataclass(frozen=True)
class Runtime:
    """A deployment runtime the bench exports to."""

    flag: str  # the command line's --<flag>, and the prefix of its options
    title: str  # its name in the table
    extra: str  # the fuseops extra that installs it
    suffix: str  # the program file's
    module: str  # imported to tell whether it is installed
    kernels: bool  # whether it has <mode>+fuseops variants
    # (model, input_ids, path, kernels) -> the program's forward on input_ids
    export: Callable[[torch.nn.Module, torch.Tensor, str, str], Callable]

    @property
    def default_variants(self) -> tuple[str, ...]:
        if not self.kernels:
            return _MODES
        return _MODES + tuple(mode + FUSEOPS_KERNELS for mode in _MODES)

    @property
    def columns(self) -> list[str]:
        return [
            "variant",
            f"{self.suffix} MiB",
            "vs float32",
            f"{self.title} ms",
            "PyTorch ms",
            "max abs diff",
        ]

    def file_bytes(self, path: str) -> int:
        # torch.onnx may keep large weights in a data file beside the model.
        data = path + ".data"
        return os.path.getsize(path) + (os.path.getsize(data) if os.path.exists(data) else 0)


def _executorch_export(module, ids, path, kernels):
    from executorch.runtime import Runtime as ExecutorchRuntime

    import fuseops.executorch

    program = fuseops.executorch.export(module, (ids,), path, kernels=kernels)
    buffer = program.buffer
    loaded = ExecutorchRuntime.get().load_program(buffer)
    method = loaded.load_method("forward")

    # The loaded program reads the buffer it was given without holding a
    # reference to it: the default argument keeps both alive with forward.
    def forward(x, _alive=(buffer, loaded)):
        return method.execute([x])[0]

    return forward


def _onnx_export(module, ids, path, kernels):
    import onnxruntime

    import fuseops.onnx

    fuseops.onnx.export(module, (ids,), path, verbose=False)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: torch.from_numpy(session.run(None, {name: x.numpy()})[0])


RUNTIMES = {
    "executorch": Runtime(
        "executorch",
        "ExecuTorch",
        "executorch",
        ".pte",
        "executorch.runtime",
        True,
        _executorch_export,
    ),
    "onnx": Runtime("onnx", "ONNX Runtime", "onnx", ".onnx", "onnxruntime", False, _onnx_export),
}


TIMING_METHOD = (
    "ms per forward: the median of the timed calls (after one untimed) of the model's forward "
    "on one prompt of --{flag}-prompt tokens (batch 1, no KV cache, the logits of every "
    "position): {title} running the exported program, and the patched model in PyTorch under "
    "torch.no_grad(); max abs diff: the largest difference between their logits."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for runtime in RUNTIMES.values():
        flag = runtime.flag
        kernels = (
            f', or with {FUSEOPS_KERNELS} run by fuseops\' kernels (kernels="fuseops")'
            if runtime.kernels
            else ""
        )
        parser.add_argument(
            f"--{flag}",
            action="store_true",
            help="instead of the ops: a Hugging Face Llama patched by fuseops.transformers.apply, "
            f"float32 and quantized, exported for {runtime.title} (fuseops.{flag}.export): "
            f"{runtime.suffix} size, ms per forward in {runtime.title} and in PyTorch, the "
            f"logits' difference; --threads, --out and --json apply (needs pip install "
            f"'fuseops[{runtime.extra}]')",
        )
        parser.add_argument(
            f"--{flag}-size",
            choices=list(decode.SIZES),
            default=DEFAULT_SIZE,
            help=f"model size, as --decode-size (default {DEFAULT_SIZE})",
        )
        parser.add_argument(
            f"--{flag}-variants",
            nargs="+",
            metavar="NAME",
            default=list(runtime.default_variants),
            help="float32 and fuseops.quantize_ modes (through apply(quantize=...) where it "
            f"takes them){kernels} (default: " + " ".join(runtime.default_variants) + ")",
        )
        parser.add_argument(
            f"--{flag}-prompt",
            type=int,
            default=DEFAULT_PROMPT,
            help=f"prompt tokens of the timed forward (default {DEFAULT_PROMPT})",
        )
        parser.add_argument(
            f"--{flag}-repeats",
            type=int,
            default=DEFAULT_REPEATS,
            help=f"timed calls, median taken (default {DEFAULT_REPEATS})",
        )


class _Logits(torch.nn.Module):
    """The model's logits of a prompt, without a cache: what is exported."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def _median_ms(call, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(
    runtime: Runtime, size: str, variant: str, prompt: int, repeats: int, path: str
) -> dict:
    """One variant's row: its program written to `path` and timed."""
    import fuseops.transformers

    spec = decode.SIZES[size]
    model = decode._model(spec, torch.float32, prompt)
    mode = variant.removesuffix(FUSEOPS_KERNELS)
    kernels = "fuseops" if mode != variant else "executorch"
    quantize: Optional[str] = None if mode == "float32" else mode
    if quantize is None or quantize in fuseops.transformers.quantize_modes():
        fuseops.transformers.apply(model, quantize=quantize)
    else:  # the 2:4 modes, which apply does not take
        fuseops.transformers.apply(model)
        fuseops.quantize_(model, quantize)
    module = _Logits(model).eval()
    ids = decode.prompt_ids(spec.vocab, 1, prompt)
    with torch.no_grad():
        forward = runtime.export(module, ids, path, kernels)
        expected = module(ids)
        pytorch_ms = _median_ms(lambda: module(ids), repeats)
    logits = forward(ids)
    return {
        "variant": variant,
        "program_bytes": runtime.file_bytes(path),
        "runtime_ms": _median_ms(lambda: forward(ids), repeats),
        "pytorch_ms": pytorch_ms,
        "max_abs_diff": (logits - expected).abs().max().item(),
    }


def _cells(row: dict, float_bytes: Optional[int], width: int) -> list[str]:
    if "error" in row:
        return [row["variant"], "ERROR: " + row["error"]] + ["-"] * (width - 2)
    ratio = "-" if not float_bytes else f"{row['program_bytes'] / float_bytes:.2f}x"
    return [
        row["variant"],
        f"{row['program_bytes'] / 2**20:.1f}",
        ratio,
        f"{row['runtime_ms']:.1f}",
        f"{row['pytorch_ms']:.1f}",
        f"{row['max_abs_diff']:.1e}",
    ]


def table(runtime: Runtime, rows: list[dict], size: str, prompt: int, repeats: int) -> str:
    spec = decode.SIZES[size]
    float_bytes = next(
        (r["program_bytes"] for r in rows if r["variant"] == "float32" and "error" not in r), None
    )
    columns = runtime.columns
    lines = [
        f"fuseops bench --{runtime.flag}, size {size}: LlamaForCausalLM, hidden {spec.hidden}, "
        f"{spec.layers} layers, vocab {spec.vocab}; one forward of {prompt} tokens, median of "
        f"{repeats}",
        "",
        "| " + " | ".join(columns) + " |",
        "| --- |" + " ---: |" * (len(columns) - 1),
    ]
    lines += ["| " + " | ".join(_cells(r, float_bytes, len(columns))) + " |" for r in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace, runtime: Runtime) -> int:
    import importlib

    flag = runtime.flag
    name = f"fuseops bench --{flag}"
    try:
        importlib.import_module(runtime.module)
    except ImportError:
        print(
            f"{name}: {runtime.title} is not installed (pip install 'fuseops[{runtime.extra}]')",
            file=sys.stderr,
        )
        return 2
    import fuseops.quantization

    modes = ["float32", *fuseops.quantization.QUANTIZE_MODES]
    variants = getattr(args, f"{flag}_variants")
    unknown = [
        v
        for v in variants
        if (v.removesuffix(FUSEOPS_KERNELS) if runtime.kernels else v) not in modes
    ]
    if unknown:
        suffix = f", each optionally with {FUSEOPS_KERNELS}" if runtime.kernels else ""
        print(
            f"{name}: unknown --{flag}-variants {unknown}; one of {modes}{suffix}",
            file=sys.stderr,
        )
        return 2
    size = getattr(args, f"{flag}_size")
    prompt = getattr(args, f"{flag}_prompt")
    repeats = getattr(args, f"{flag}_repeats")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for variant in variants:
        path = os.path.join(args.out, f"llama-{size}-{variant}{runtime.suffix}")
        try:
            rows.append(measure(runtime, size, variant, prompt, repeats, path))
        except Exception as error:  # a row's failure is its row's, not the run's
            rows.append({"variant": variant, "error": f"{type(error).__name__}: {error}"})
    env = decode._environment()
    method = TIMING_METHOD.format(flag=flag, title=runtime.title)
    text = "\n\n".join(
        [
            f"fuseops {env['fuseops_version']}, torch {env['torch_version']}; CPU "
            f"{env['cpu_model']}, {env['logical_cpus']} logical CPUs, {env['threads']} threads",
            table(runtime, rows, size, prompt, repeats),
            method,
        ]
    )
    print(text)
    json_path = args.json or os.path.join(args.out, f"{flag}.json")
    with open(json_path, "w") as f:
        json.dump(
            {
                "environment": env,
                "runtime": runtime.title,
                "size": size,
                "prompt_tokens": prompt,
                "repeats": repeats,
                "method": method,
                "rows": rows,
            },
            f,
            indent=2,
        )
    with open(os.path.join(args.out, f"{flag}.txt"), "w") as f:
        f.write(text + "\n")
    print(f"wrote {json_path}")
    return 0 if all("error" not in r for r in rows) else 1
