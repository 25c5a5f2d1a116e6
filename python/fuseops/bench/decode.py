"""``python -m fuseops bench --decode``: token-by-token decoding as a CPU
user of ``model.generate()`` meets it, for a Hugging Face Llama model built
from a config (random weights, nothing downloaded): HF's bfloat16 model as
shipped (and, with ``--decode-compile``, it under ``torch.compile`` with a
static cache, and it and fuseops' models with a compiled decode step,
``fuseops.transformers.compile_decoding``), the same model after ``fuseops.transformers.apply``, with
``quantize="w8a16"``, ``"w8a8"`` and, where the installation has it,
``"w4a16"`` (q/k/v and gate/up merged, apply's default when quantizing;
w8a16 once more with them separate, to show what the merge gains, and
with a static cache, whose steps run ``fuseops.rope_cache_attention``),
torch.ao's dynamic int8 ``Linear`` on a float32 copy and, where
llama-cpp-python and gguf are installed, llama.cpp on the same weights in
GGUF BF16, Q8_0 and Q4_0 (``llama_cpp_anchor.py``).

Each variant builds the model afresh from the same seed and runs greedy
``generate``. The model has no end-of-sequence token (its weights are
random: no token means "stop"), so every generate makes exactly
``max_new_tokens`` tokens with no stopping check, as the llama.cpp rows
decode; forcing the length with ``min_new_tokens`` instead would add
transformers' ``MinNewTokensLogitsProcessor`` (a ``torch.isin`` over the
whole vocabulary and a ``torch.where`` over the logits, about 0.5 ms a
step on a 2-core CPU), which a user's generate does not run. The decode time per token is ``(t_N -
t_1) / (N - 1)``: ``t_N`` is a generate of N new tokens (the prefill of the
prompt, which gives the first token, then N - 1 decode steps), ``t_1`` a
generate of one token (the prefill alone), each the median of
``--decode-repeats`` runs after a warm-up generate of each of the two
lengths (a static cache, whose length is the prompt's plus the new
tokens', compiles a graph for each). One step
makes one token for every sequence of the batch: tokens/s is batch * 1000
/ (ms per token). The bytes a step reads are those of every parameter and
buffer the forward reads (quantized layers: their packed weights and
scales), the embedding counted as one row per sequence, the LM head in
full; the KV cache and activations are not counted. GB/s is those bytes
over the step's time; "% of copy" compares it with a tensor copy timed
in the same run and "% of read" with a large read (a sum), which is what a
decode step's weights ask of memory. Peak memory is the process's resident set high-water
mark during the timed generate calls above the resident set before them
(the weights are in "weights MiB").
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from . import hf_models
from . import llama_cpp_anchor as llama_cpp_anchor_module
from .llama_cpp_anchor import QUANTS
from .environment import cpu_model


#: A model size of this benchmark: a Llama's dimensions.
Size = hf_models.LlamaShape


SIZES = {
    # The tests' run: seconds.
    "tiny": Size(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=256),
    # About 155M parameters, a third of them the embedding and the head.
    "small": Size(hidden=1024, layers=8, heads=16, kv_heads=4, intermediate=2816, vocab=32000),
    # About 0.85B parameters: the layers' weights dominate, as in the 1B
    # Llama-style models run on CPUs.
    "large": Size(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=5632, vocab=32000),
}
DEFAULT_SIZES = ("small", "large")
DEFAULT_BATCHES = (1, 8)
DEFAULT_PROMPT = 128
DEFAULT_NEW_TOKENS = 128
DEFAULT_REPEATS = 3

#: Each of the copy's two tensors: far larger than any last-level cache.
COPY_BYTES = 512 << 20
COPY_REPEATS = 5
#: The summed tensor of the read bandwidth: as large as both of the copy's.
READ_BYTES = 1 << 30
READ_REPEATS = 5

TIMING_METHOD = (
    "ms per token: (t_N - t_1) / (N - 1), where t_N is the median time of a greedy generate of "
    "N new tokens (a model without an end-of-sequence token, so generate makes exactly N; the prefill, which makes the first "
    "token, and N - 1 decode steps) and t_1 that of a generate of 1 token (the prefill alone), "
    "after a warm-up generate of each length; one step makes a token for every sequence of the "
    "batch, so tokens/s = batch * 1000 / ms per token."
)
BYTES_METHOD = (
    "bytes read per step: every parameter and buffer of the model, once per step "
    "(quantized layers: their packed weights, scales and biases, the column sums in W8A8 "
    "only; torch.ao's dynamic Linear: its int8 weight and float bias), the embedding as one "
    "row per sequence, the LM head in full: what the forward reads, but for the few bytes "
    "of the rotary embedding's spare copy of its frequencies; not the KV cache, the "
    "activations or the logits. GB/s = those bytes / the step's time (10^9 bytes)."
)
COPY_METHOD = (
    f"copy bandwidth: dst.copy_(src) of two {COPY_BYTES >> 20} MiB uint8 tensors with torch's "
    f"threads, best of {COPY_REPEATS}, counted as (bytes read + bytes written) / time; "
    "% of copy = the step's GB/s (bytes read only) / the copy's GB/s."
)
READ_METHOD = (
    f"read bandwidth: torch.sum of a {READ_BYTES >> 20} MiB float32 tensor with torch's threads, "
    f"best of {READ_REPEATS}, counted as bytes read / time: a decode step reads its weights "
    "and writes next to nothing, so this, not the copy, is the memory's limit for it; "
    "% of read = the step's GB/s / the read's GB/s."
)
PEAK_METHOD = (
    "peak MiB: the process's resident set high-water mark (VmHWM, reset through "
    "/proc/self/clear_refs) during the timed generate calls of one batch size, above the "
    "resident set before them, glibc's free memory returned to the system first "
    "(malloc_trim): the KV cache, activations, logits and temporaries, not the weights "
    "('weights MiB': the bytes of the model's parameters and buffers as stored). None "
    "where the kernel offers no resettable high-water mark."
)

LLAMA_CPP_INSTALL = "pip install llama-cpp-python gguf, or pip install 'fuseops[bench-llama]'"


def _list_of(parse: Callable[[str], object], allowed: Optional[dict] = None):
    def parse_list(text: str) -> list:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        if allowed is not None:
            unknown = [item for item in items if item not in allowed]
            if unknown:
                raise argparse.ArgumentTypeError(
                    f"unknown {', '.join(unknown)}: use {', '.join(allowed)}"
                )
        try:
            return [parse(item) for item in items]
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse_list


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--decode",
        action="store_true",
        help="instead of the ops: greedy model.generate() token by token on a Hugging Face "
        "Llama model from a config, HF's bfloat16 model against fuseops.transformers.apply "
        "with and without quantize= and torch.ao's dynamic int8; ms per token, tokens/s, "
        "bytes read per step, GB/s against a copy, peak memory; --threads, --out and "
        "--json apply",
    )
    parser.add_argument(
        "--decode-size",
        type=_list_of(str, SIZES),
        default=list(DEFAULT_SIZES),
        help="comma-separated model sizes ("
        + "; ".join(
            f"{name}: hidden {s.hidden}, {s.layers} layers, {s.heads}/{s.kv_heads} heads, "
            f"intermediate {s.intermediate}, vocab {s.vocab}"
            for name, s in SIZES.items()
        )
        + f"; default {','.join(DEFAULT_SIZES)})",
    )
    parser.add_argument(
        "--decode-batch",
        type=_list_of(_positive),
        default=list(DEFAULT_BATCHES),
        help=f"comma-separated batch sizes (default {','.join(map(str, DEFAULT_BATCHES))})",
    )
    parser.add_argument(
        "--decode-prompt",
        type=_positive,
        default=DEFAULT_PROMPT,
        help=f"prompt tokens per sequence (default {DEFAULT_PROMPT})",
    )
    parser.add_argument(
        "--decode-new-tokens",
        type=_positive,
        default=DEFAULT_NEW_TOKENS,
        help=f"new tokens per sequence, at least 2 (default {DEFAULT_NEW_TOKENS})",
    )
    parser.add_argument(
        "--decode-repeats",
        type=_positive,
        default=DEFAULT_REPEATS,
        help=f"timed generate calls of each length, median taken (default {DEFAULT_REPEATS})",
    )
    parser.add_argument(
        "--decode-variants",
        nargs="+",
        metavar="NAME",
        default=None,
        help="only these rows, by their names in the table (quote each: "
        "--decode-variants 'HF bf16' 'fuseops w4a8' 'llama.cpp Q4_0'; default: every row)",
    )
    parser.add_argument(
        "--decode-compile",
        action="store_true",
        help="also the compiled variants: HF's bfloat16 model under torch.compile with a "
        "static KV cache, and HF's and fuseops' models with "
        "fuseops.transformers.compile_decoding (compilation takes minutes on a few cores)",
    )


# ---------------------------------------------------------------------------
# The variants


@dataclass(frozen=True)
class Variant:
    name: str
    dtype: torch.dtype
    #: Turns the freshly built model (eval mode, in `dtype`) into the one
    #: that generates.
    prepare: Callable[[torch.nn.Module], torch.nn.Module]
    static_cache: bool = False
    #: Compiles graphs, released (torch._dynamo.reset) after its row.
    compiled: bool = False


def _unchanged(model: torch.nn.Module) -> torch.nn.Module:
    return model


def _compiled(model: torch.nn.Module) -> torch.nn.Module:
    # HF's recipe for a compiled generate: the forward compiled, a static
    # cache so that every decode step has the same shapes.
    model.forward = torch.compile(model.forward, dynamic=False)
    return model


def _fuseops(
    quantize: Optional[str],
    fuse_projections: Optional[bool] = None,
    attention: bool = True,
    linear: bool = True,
) -> Callable[[torch.nn.Module], torch.nn.Module]:
    def prepare(model: torch.nn.Module) -> torch.nn.Module:
        import fuseops.transformers

        fuseops.transformers.apply(
            model,
            quantize=quantize,
            fuse_projections=fuse_projections,
            attention=attention,
            linear=linear,
        )
        return model

    return prepare


def _then(
    prepare: Callable[[torch.nn.Module], torch.nn.Module],
    step: Callable[[torch.nn.Module], None],
) -> Callable[[torch.nn.Module], torch.nn.Module]:
    # A variant's preparation followed by one more in-place change of the model.
    def prepared(model: torch.nn.Module) -> torch.nn.Module:
        model = prepare(model)
        step(model)
        return model

    return prepared


def _widen_int4_scales(model: torch.nn.Module) -> None:
    # The int4 layers' scales and zero points in float32 instead of
    # Int4Linear's default bfloat16: what the smaller scale_zero gains.
    from fuseops.nn import Int4Linear

    for module in model.modules():
        if isinstance(module, Int4Linear):
            module._buffers["scale_zero"] = module.scale_zero.float()


def _float32_scales(
    prepare: Callable[[torch.nn.Module], torch.nn.Module],
) -> Callable[[torch.nn.Module], torch.nn.Module]:
    return _then(prepare, _widen_int4_scales)


def _compile_decoding(model: torch.nn.Module) -> None:
    import fuseops.transformers

    fuseops.transformers.compile_decoding(model)


def _compiled_decoding(
    prepare: Callable[[torch.nn.Module], torch.nn.Module],
) -> Callable[[torch.nn.Module], torch.nn.Module]:
    return _then(prepare, _compile_decoding)


def _torch_ao_dynamic(model: torch.nn.Module) -> torch.nn.Module:
    with warnings.catch_warnings():
        # torch.ao.quantization announces its deprecation on every call.
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(
            model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True
        )


def variants(compile_peer: bool) -> list[Variant]:
    """The variants of this installation: w4a16 where
    ``fuseops.transformers.quantize_modes()`` has it."""
    import fuseops.transformers

    bf16 = torch.bfloat16
    chosen = [Variant("HF bf16", bf16, _unchanged)]
    if compile_peer:
        chosen.append(
            Variant(
                "HF bf16 + torch.compile (static cache)",
                bf16,
                _compiled,
                static_cache=True,
                compiled=True,
            )
        )
    chosen.append(Variant("fuseops bf16", bf16, _fuseops(None)))
    # What fuseops.linear (apply's default for float models) gains over ATen's.
    chosen.append(Variant("fuseops bf16, ATen linear", bf16, _fuseops(None, linear=False)))
    chosen += [
        Variant(f"fuseops {mode}", bf16, _fuseops(mode))
        for mode in fuseops.transformers.quantize_modes()
    ]
    if compile_peer:
        # The decode step compiled, the prefill eager (transformers' own
        # generate mechanism; static cache, C++ wrapper, no module guards).
        chosen.append(
            Variant(
                "HF bf16, compile_decoding", bf16, _compiled_decoding(_unchanged), compiled=True
            )
        )
        for mode in [None, *fuseops.transformers.quantize_modes()]:
            chosen.append(
                Variant(
                    f"fuseops {mode or 'bf16'}, compile_decoding",
                    bf16,
                    _compiled_decoding(_fuseops(mode)),
                    compiled=True,
                )
            )
    if "w4a8" in fuseops.transformers.quantize_modes():
        # What bfloat16 scale_zero (Int4Linear's default) gains over float32.
        float32_scales = _float32_scales(_fuseops("w4a8"))
        chosen.append(Variant("fuseops w4a8, float32 scales", bf16, float32_scales))
        if compile_peer:
            chosen.append(
                Variant(
                    "fuseops w4a8, float32 scales, compile_decoding",
                    bf16,
                    _compiled_decoding(float32_scales),
                    compiled=True,
                )
            )
    # What merging q/k/v and gate/up (apply's default when quantizing) gains.
    chosen.append(Variant("fuseops w8a16, projections separate", bf16, _fuseops("w8a16", False)))
    # A static cache in eager generate: each step's attention layers run
    # fuseops.rope_cache_attention (rotary, cache write and attention in one
    # call), where the dynamic cache concatenates every layer's keys.
    chosen.append(
        Variant("fuseops w8a16, static cache", bf16, _fuseops("w8a16"), static_cache=True)
    )
    # What fuseops.decode_attention (apply's default) gains over HF's SDPA path.
    chosen.append(
        Variant("fuseops w8a16, SDPA attention", bf16, _fuseops("w8a16", attention=False))
    )
    chosen.append(
        Variant("torch.ao dynamic int8 (float32 activations)", torch.float32, _torch_ao_dynamic)
    )
    return chosen


def _model(size: Size, dtype: torch.dtype, positions: int):
    import transformers

    config = transformers.LlamaConfig(
        **size.config_options(positions),
        # Random weights: no token ends a sequence, every generate makes
        # exactly max_new_tokens tokens (see the module's docstring).
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    model.generation_config.eos_token_id = None
    return model


# ---------------------------------------------------------------------------
# What a step reads, what the model holds


def _dynamic_linear_tensors(module: torch.nn.Module) -> Optional[list[torch.Tensor]]:
    """torch.ao's quantized Linear keeps its weight in a packed object held
    by its LinearPackedParams child, not in parameters or buffers: the int8
    weight and float bias it packs."""
    from torch.ao.nn.quantized.modules.linear import LinearPackedParams

    if not isinstance(module, LinearPackedParams):
        return None
    weight, bias = module._weight_bias()
    return [weight] + ([] if bias is None else [bias])


def _module_tensors(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    dynamic = _dynamic_linear_tensors(module)
    if dynamic is not None:
        yield from (("", t) for t in dynamic)
        return
    yield from module.named_parameters(recurse=False)
    yield from ((name, b) for name, b in module.named_buffers(recurse=False) if b is not None)


class _Counted:
    """Tensors counted once each: shared ones (a tied head) by their
    storage. The tensors are kept, so that the address of one unpacked for
    the count (torch.ao's) is not reused by the next and taken for it."""

    def __init__(self) -> None:
        self.tensors: dict[int, torch.Tensor] = {}
        self.bytes = 0

    def add(self, tensor: torch.Tensor) -> None:
        if tensor.data_ptr() not in self.tensors:
            self.tensors[tensor.data_ptr()] = tensor
            self.bytes += tensor.numel() * tensor.element_size()


def stored_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers as stored, shared ones once."""
    counted = _Counted()
    for module in model.modules():
        for _, tensor in _module_tensors(module):
            counted.add(tensor)
    return counted.bytes


def bytes_read_per_step(model: torch.nn.Module, batch: int) -> int:
    """Bytes of the parameters and buffers one decode step of `batch`
    sequences reads (method in BYTES_METHOD)."""
    counted, rows = _Counted(), 0
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            # One row per sequence; a head tied to it still reads it in full.
            rows += batch * module.embedding_dim * module.weight.element_size()
            continue
        # The column sums serve the W8A8 kernels only.
        w8a8 = str(getattr(module, "mode", "")).endswith("w8a8")
        for name, tensor in _module_tensors(module):
            if name != "colsum" or w8a8:
                counted.add(tensor)
    return rows + counted.bytes


# ---------------------------------------------------------------------------
# Memory and bandwidth of the machine


def _status_kib(*fields: str) -> Optional[dict[str, int]]:
    try:
        with open("/proc/self/status") as f:
            values = {
                line.split(":")[0]: int(line.split()[1]) for line in f if line.startswith(fields)
            }
    except OSError:
        return None
    return values if all(field in values for field in fields) else None


def _release_free_memory() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@contextlib.contextmanager
def resident_peak() -> Iterator[dict]:
    """Yields a dict whose ``bytes`` is, on exit, the resident set's
    high-water mark during the block above the resident set at its start
    (None where the high-water mark cannot be reset)."""
    result: dict = {"bytes": None}
    _release_free_memory()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident set
        start = _status_kib("VmRSS")
    except OSError:
        start = None
    yield result
    end = _status_kib("VmHWM")
    if start is not None and end is not None:
        result["bytes"] = max(0, end["VmHWM"] - start["VmRSS"]) * 1024


def copy_bandwidth() -> float:
    """GB/s of a large tensor copy, (read + write) / time (COPY_METHOD)."""
    src = torch.ones(COPY_BYTES, dtype=torch.uint8)
    dst = torch.zeros_like(src)  # its pages faulted in before the timing
    best = float("inf")
    for _ in range(COPY_REPEATS):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * COPY_BYTES / best / 1e9


def read_bandwidth() -> float:
    """GB/s of a sum of a large tensor, bytes read / time (READ_METHOD). A
    copy also writes, and on some machines writes cost more than reads: the
    copy's (read + write) / time is then below what the step's reads get."""
    data = torch.ones(READ_BYTES // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(READ_REPEATS):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return READ_BYTES / best / 1e9


def bandwidth() -> dict[str, float]:
    """The machine's copy and read GB/s, measured now (COPY_METHOD, READ_METHOD)."""
    return {"copy_gb_per_s": copy_bandwidth(), "read_gb_per_s": read_bandwidth()}


LLAMA_CPP_ANCHOR = "llama.cpp anchor (BF16/Q8_0/Q4_0)"


def llama_cpp_anchor(measured: Sequence[str] = (), skipped: Optional[dict[str, str]] = None) -> str:
    """The line on the llama.cpp rows (BF16, Q8_0, Q4_0 of the same model):
    how the sizes `measured` got theirs, or why the run has none: llama_cpp
    or gguf not importable, or each size's model not convertible
    (`skipped`: size -> reason)."""
    missing = llama_cpp_anchor_module.missing_modules()
    if missing:
        return (
            f"{LLAMA_CPP_ANCHOR} skipped: {' and '.join(missing)} not importable; "
            f"{LLAMA_CPP_INSTALL}"
        )
    reasons = "; ".join(f"size {size}: {reason}" for size, reason in (skipped or {}).items())
    if not measured:
        return f"{LLAMA_CPP_ANCHOR} skipped: " + (reasons or "no model size run")
    rows = ", ".join(f"'{llama_cpp_anchor_module.ROW_PREFIX}{q}'" for q, _ in QUANTS)
    return (
        f"{LLAMA_CPP_ANCHOR}: rows {rows} ({llama_cpp_anchor_module.versions()}, "
        f"{torch.get_num_threads()} threads): {llama_cpp_anchor_module.METHOD}"
        + (f"; skipped for {reasons}" if reasons else "")
    )


# ---------------------------------------------------------------------------
# The run


def _generator(model, ids: torch.Tensor, new_tokens: int, static_cache: bool):
    """generate(n): a greedy generate of exactly n new tokens for `ids`."""
    mask = torch.ones_like(ids)
    cache = None
    if static_cache:
        import transformers

        cache = transformers.StaticCache(
            config=model.config, max_cache_len=ids.shape[1] + new_tokens
        )

    def generate(n: int) -> torch.Tensor:
        options = {}
        if cache is not None:
            cache.reset()
            options["past_key_values"] = cache
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            **options,
        )
        if out.shape[1] != ids.shape[1] + n:
            raise RuntimeError(f"generate made {out.shape[1] - ids.shape[1]} tokens, not {n}")
        return out

    return generate


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def prompt_ids(vocab: int, batch: int, prompt: int) -> torch.Tensor:
    """The prompts of a batch size, the same for every variant."""
    gen = torch.Generator().manual_seed(batch)
    return torch.randint(0, vocab, (batch, prompt), generator=gen)


def _bench_batch(model, variant: Variant, size: Size, batch: int, args, memory: dict) -> dict:
    ids = prompt_ids(size.vocab, batch, args.decode_prompt)
    generate = _generator(model, ids, args.decode_new_tokens, variant.static_cache)
    return _measured(generate, batch, bytes_read_per_step(model, batch), args, memory)


def _measured(generate: Callable[[int], object], batch: int, read: int, args, memory: dict) -> dict:
    """One batch size's figures (TIMING_METHOD) of `generate(n)`, a greedy
    decode of exactly n new tokens, each step reading `read` bytes; `memory`
    is :func:`bandwidth`'s."""
    new_tokens = args.decode_new_tokens
    # Both lengths once: the compiled variants compile their graphs (one per
    # static cache length) here, not in the timed calls.
    generate(1)
    generate(new_tokens)
    prefill, total = [], []
    with resident_peak() as peak:
        for _ in range(args.decode_repeats):
            prefill.append(_timed(lambda: generate(1)))
            total.append(_timed(lambda: generate(new_tokens)))
    prefill_s, total_s = statistics.median(prefill), statistics.median(total)
    return {
        "batch": batch,
        "prefill_s": prefill_s,
        "generate_s": total_s,
        **step_figures(prefill_s, total_s, new_tokens, batch, read, memory),
        "peak_bytes": peak["bytes"],
    }


def step_figures(
    prefill_s: float, total_s: float, new_tokens: int, batch: int, read: int, memory: dict
) -> dict:
    """A decode step's figures from a generate of 1 token (`prefill_s`) and
    one of `new_tokens` (`total_s`). Where timing noise leaves no decode time
    (a run so short that t_N <= t_1), the step was not measured: every figure
    is None, never a negative or infinite time."""
    step_s = (total_s - prefill_s) / (new_tokens - 1) if new_tokens > 1 else 0.0
    if step_s <= 0:
        unmeasured = ("ms_per_token", "tokens_per_s", "gb_per_s", "percent_of_copy")
        return dict.fromkeys(unmeasured + ("percent_of_read",)) | {"bytes_read_per_step": read}
    gb_s = read / step_s / 1e9
    return {
        "ms_per_token": step_s * 1e3,
        "tokens_per_s": batch / step_s,
        "bytes_read_per_step": read,
        "gb_per_s": gb_s,
        "percent_of_copy": _percent(gb_s, memory["copy_gb_per_s"]),
        "percent_of_read": _percent(gb_s, memory["read_gb_per_s"]),
    }


def _percent(gb_s: Optional[float], of: float) -> Optional[float]:
    return 100 * gb_s / of if gb_s is not None else None


def _selected(args, name: str) -> bool:
    return args.decode_variants is None or name in args.decode_variants


def row_names(compile_peer: bool) -> list[str]:
    """Every row --decode-variants can name: the variants, then llama.cpp's."""
    anchor = llama_cpp_anchor_module
    return [v.name for v in variants(compile_peer)] + [anchor.ROW_PREFIX + q for q, _ in QUANTS]


def _bench_size(name: str, args, memory: dict) -> dict:
    size = SIZES[name]
    positions = args.decode_prompt + args.decode_new_tokens
    rows = []
    parameters = None
    for variant in variants(args.decode_compile):
        if not _selected(args, variant.name):
            continue
        print(f"{name}: {variant.name}", file=sys.stderr, flush=True)
        row: dict = {"variant": variant.name}
        try:
            model = _model(size, variant.dtype, positions)
            if parameters is None:
                # The float model's: a quantized one keeps its weights in buffers.
                parameters = sum(p.numel() for p in model.parameters())
            model = variant.prepare(model)
            row["weights_bytes"] = stored_bytes(model)
            row["batches"] = [
                _bench_batch(model, variant, size, batch, args, memory)
                for batch in args.decode_batch
            ]
        except Exception as error:  # one variant's failure is its row's, the run goes on
            row["error"] = f"{type(error).__name__}: {error}"
        rows.append(row)
        model = None
        if variant.compiled:
            torch._dynamo.reset()
        _release_free_memory()
    llama_rows, skipped = _llama_cpp_rows(name, args, memory)
    result = {"size": name, "config": asdict(size), "parameters": parameters}
    result["rows"] = rows + llama_rows
    if skipped is not None:
        result["llama_cpp_skipped"] = skipped
    return result


def _llama_cpp_rows(name: str, args, memory: dict) -> tuple[list[dict], Optional[str]]:
    """The rows "llama.cpp BF16", "llama.cpp Q8_0", "llama.cpp Q4_0" of a
    size (llama_cpp_anchor.py), and why there are none: None where they
    were made or llama_cpp/gguf are missing (the anchor line says so)."""
    anchor = llama_cpp_anchor_module
    if anchor.missing_modules():
        return [], None
    size = SIZES[name]
    positions = args.decode_prompt + args.decode_new_tokens
    threads = torch.get_num_threads()
    names = [anchor.ROW_PREFIX + q for q, _ in QUANTS]
    if not any(_selected(args, n) for n in names):
        return [], None
    with tempfile.TemporaryDirectory(prefix="fuseops-gguf-") as folder:
        print(f"{name}: llama.cpp, the model to GGUF", file=sys.stderr, flush=True)
        try:
            paths = anchor.convert(_model(size, torch.bfloat16, positions), folder, threads)
        except anchor.NotConvertible as error:
            return [], str(error)
        except Exception as error:
            failed = f"GGUF conversion: {type(error).__name__}: {error}"
            return [{"variant": n, "error": failed} for n in names], None
        _release_free_memory()
        rows = []
        for (quant, _), variant in zip(QUANTS, names):
            if not _selected(args, variant):
                continue
            print(f"{name}: {variant}", file=sys.stderr, flush=True)
            row: dict = {"variant": variant}
            try:
                tensors = anchor.tensor_infos(paths[quant])
                row["weights_bytes"] = anchor.stored_bytes(tensors)
                types = [t.type for t in tensors]
                row["gguf_tensor_types"] = {t: types.count(t) for t in sorted(set(types))}
                row["batches"] = _llama_cpp_timed(
                    paths[quant],
                    batches=args.decode_batch,
                    vocab=size.vocab,
                    prompt=args.decode_prompt,
                    new_tokens=args.decode_new_tokens,
                    repeats=args.decode_repeats,
                    threads=threads,
                    memory=memory,
                )
            except Exception as error:  # as a variant's: the row's, the run goes on
                row["error"] = f"{type(error).__name__}: {error}"
            rows.append(row)
    return rows, None


# ---------------------------------------------------------------------------
# The timing, in a process of its own


def _llama_cpp_timed(
    path: str,
    *,
    batches: Sequence[int],
    vocab: int,
    prompt: int,
    new_tokens: int,
    repeats: int,
    threads: int,
    memory: dict,
) -> list[dict]:
    """The figures of the GGUF file at `path` at each batch size, as a
    variant's (the same prompts, TIMING_METHOD), measured by a child Python
    process: llama.cpp, a C++ library of its own, may crash (its AMX kernels
    do on some CPUs), and a crash there is this RuntimeError, the row's
    error, not the end of the run."""
    spec: dict[str, Any] = dict(
        path=path,
        batches=list(batches),
        vocab=vocab,
        prompt=prompt,
        new_tokens=new_tokens,
        repeats=repeats,
        threads=threads,
        memory=memory,
        out=path + ".json",
    )
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "from fuseops.bench.decode import _llama_cpp_child; _llama_cpp_child()",
        ],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
    )
    if child.returncode != 0:
        code = child.returncode
        ended = (
            f"died of {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        )
        tail = " | ".join(line for line in child.stderr.strip().splitlines()[-3:])
        hint = ""
        if code < 0 and "AMX_INT8 = 1" in child.stderr:
            hint = (
                " (llama.cpp's AMX kernels crash on some CPUs: build llama-cpp-python "
                "without them, see PERFORMANCE.md)"
            )
        raise RuntimeError(f"the llama.cpp process {ended}{hint}: {tail}")
    with open(spec["out"]) as f:
        return json.load(f)


def _llama_cpp_child() -> None:
    """The child of _llama_cpp_timed: reads its spec from stdin, writes the
    figures as JSON to spec["out"]."""
    import llama_cpp

    anchor = llama_cpp_anchor_module
    spec = json.loads(sys.stdin.read())
    # What llama.cpp was built for, for the parent's message if it crashes.
    print(llama_cpp.llama_print_system_info().decode(), file=sys.stderr, flush=True)
    args = argparse.Namespace(decode_new_tokens=spec["new_tokens"], decode_repeats=spec["repeats"])
    tensors = anchor.tensor_infos(spec["path"])
    positions = spec["prompt"] + spec["new_tokens"]
    figures = []
    with anchor.Model(spec["path"]) as model:
        for batch in spec["batches"]:
            ids = prompt_ids(spec["vocab"], batch, spec["prompt"])
            read = anchor.bytes_read_per_step(tensors, batch)
            # llama.cpp allocates its KV cache and buffers with the context,
            # before the timed calls: the peak counts from there.
            with resident_peak() as peak:
                with anchor.Decoder(model, batch, positions, spec["threads"]) as decoder:
                    figures.append(
                        _measured(
                            lambda n: decoder.generate(ids, n),
                            batch,
                            read,
                            args,
                            spec["memory"],
                        )
                    )
            figures[-1]["peak_bytes"] = peak["bytes"]
    with open(spec["out"], "w") as f:
        json.dump(figures, f)


def _number(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


TABLE_COLUMNS = [
    "variant",
    "batch",
    "ms/token",
    "tokens/s",
    "MB read/step",
    "GB/s",
    "% of copy",
    "% of read",
    "weights MiB",
    "peak MiB",
]


def _scaled(value, scale: float):
    return None if value is None else value / scale


def batch_cells(row: dict, b: dict) -> list[str]:
    """One line of the table: a variant's figures at one batch size (a
    missing figure is "-")."""
    return [
        "-" if row.get("variant") is None else str(row["variant"]),
        "-" if b.get("batch") is None else str(b["batch"]),
        _number(b.get("ms_per_token"), 2),
        _number(b.get("tokens_per_s"), 1),
        _number(_scaled(b.get("bytes_read_per_step"), 1e6), 2),
        _number(b.get("gb_per_s"), 1),
        _number(b.get("percent_of_copy"), 0),
        _number(b.get("percent_of_read"), 0),
        _number(_scaled(row.get("weights_bytes"), 2**20), 1),
        _number(_scaled(b.get("peak_bytes"), 2**20), 1),
    ]


def table(result: dict, args) -> str:
    size = SIZES[result["size"]]
    parameters = result["parameters"]
    lines = [
        f"fuseops bench --decode, size {result['size']}: LlamaForCausalLM, hidden {size.hidden}, "
        f"{size.layers} layers, {size.heads}/{size.kv_heads} heads, intermediate "
        f"{size.intermediate}, vocab {size.vocab}"
        + (f", {parameters / 1e6:.1f}M parameters" if parameters else "")
        + f"; prompt {args.decode_prompt}, {args.decode_new_tokens} new tokens, greedy, "
        f"median of {args.decode_repeats}",
        "",
        "| " + " | ".join(TABLE_COLUMNS) + " |",
        "| --- |" + " ---: |" * (len(TABLE_COLUMNS) - 1),
    ]
    for row in result["rows"]:
        if "error" in row:
            lines.append(f"| {row['variant']} | ERROR: {row['error']} | | | | | | | |")
            continue
        for b in row["batches"]:
            lines.append("| " + " | ".join(batch_cells(row, b)) + " |")
    return "\n".join(lines)


def _environment() -> dict:
    import transformers

    import fuseops

    policy = os.environ.get("OMP_WAIT_POLICY")
    return {
        "fuseops_version": fuseops.__version__,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "omp_wait_policy": policy,
        "load_average_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "fuseops_cpu_capability": fuseops.build_info()["selected_cpu_capability"],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def header(env: dict, memory: dict) -> str:
    policy = env["omp_wait_policy"]
    load = env["load_average_at_start"]
    return "\n".join(
        [
            f"fuseops {env['fuseops_version']}, torch {env['torch_version']}, transformers "
            f"{env['transformers_version']}; CPU {env['cpu_model']}, {env['logical_cpus']} "
            f"logical CPUs, {env['threads']} threads",
            "OMP_WAIT_POLICY "
            + (policy if policy else "unset (OpenMP's default)")
            + "; decode runs many short parallel regions, so it is sensitive to how "
            "OpenMP's threads wait",
            f"copy {memory['copy_gb_per_s']:.1f} GB/s ((read + write) / time of a "
            f"{COPY_BYTES >> 20} MiB tensor copy, best of {COPY_REPEATS}); read "
            f"{memory['read_gb_per_s']:.1f} GB/s (a sum of {READ_BYTES >> 20} MiB, best of "
            f"{READ_REPEATS})"
            + (f"; load average {load:.1f} at the start" if load is not None else ""),
        ]
    )


def run(args: argparse.Namespace) -> int:
    if hf_models.cannot_run("--decode", args.device):
        return 2
    if args.decode_new_tokens < 2:
        print(
            "fuseops bench --decode: --decode-new-tokens must be at least 2 (the decode time "
            "is that of the tokens after the first)",
            file=sys.stderr,
        )
        return 2
    if args.decode_variants is not None:
        known = row_names(args.decode_compile)
        unknown = [n for n in args.decode_variants if n not in known]
        if unknown:
            print(
                f"fuseops bench --decode: unknown --decode-variants {unknown}; the rows "
                f"(--decode-compile adds the compiled ones): {known}",
                file=sys.stderr,
            )
            return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    env = _environment()
    memory = bandwidth()
    results = [_bench_size(name, args, memory) for name in args.decode_size]
    skipped = {r["size"]: r["llama_cpp_skipped"] for r in results if "llama_cpp_skipped" in r}
    measured = [
        r["size"]
        for r in results
        if any(
            str(row["variant"]).startswith(llama_cpp_anchor_module.ROW_PREFIX) for row in r["rows"]
        )
    ]
    anchor = llama_cpp_anchor(measured, skipped)
    text = "\n\n".join([header(env, memory)] + [table(r, args) for r in results] + [anchor])
    print(text)
    os.makedirs(args.out, exist_ok=True)
    json_path = args.json or os.path.join(args.out, "decode.json")
    with open(json_path, "w") as f:
        json.dump(
            {
                "environment": env,
                "prompt_tokens": args.decode_prompt,
                "new_tokens": args.decode_new_tokens,
                "repeats": args.decode_repeats,
                "batches": args.decode_batch,
                **memory,
                "method": {
                    "timing": TIMING_METHOD,
                    "bytes_read": BYTES_METHOD,
                    "copy": COPY_METHOD,
                    "read": READ_METHOD,
                    "peak_memory": PEAK_METHOD,
                },
                "results": results,
                "llama_cpp": anchor,
            },
            f,
            indent=2,
        )
    table_path = os.path.join(args.out, "decode.txt")
    with open(table_path, "w") as f:
        f.write(text + "\n")
    print(f"wrote {table_path}; JSON {json_path}")
    failed = any("error" in row for result in results for row in result["rows"])
    return 1 if failed else 0
