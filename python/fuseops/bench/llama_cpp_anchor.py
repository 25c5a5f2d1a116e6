"""The llama.cpp anchor of ``python -m fuseops bench --decode``: the bench's
random-weight ``LlamaForCausalLM`` written to a GGUF file in BF16 (gguf's
writer, with the tensor names and the q/k row order of llama.cpp's own
converter, no tokenizer: the prompts are token ids), quantized to Q8_0 and
Q4_0 by llama.cpp's quantizer (``llama_model_quantize``, its default tensor
mix), and decoded greedily through llama.cpp's C API as llama-cpp-python
binds it (``llama_decode`` of one sequence per batch row, the argmax of each
row's logits), timed by ``decode`` with the method of its other rows.

Optional: it needs ``llama_cpp`` and ``gguf`` (``pip install
'fuseops[bench-llama]'``); everything here imports them inside the
functions that use them, so the pure parts (the tensor names, the q/k
permutation, the byte count) run without them.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import importlib.util
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

import torch

MODULES = ("llama_cpp", "gguf")

#: The GGUF types of the anchor's rows: (name, llama_ftype of the quantizer,
#: None for the converted file itself). Values of llama.h's llama_ftype.
QUANTS: tuple[tuple[str, Optional[int]], ...] = (("BF16", None), ("Q8_0", 7), ("Q4_0", 2))
#: llama_ftype LLAMA_FTYPE_MOSTLY_BF16, the converted file's general.file_type.
FTYPE_BF16 = 32

ROW_PREFIX = "llama.cpp "

METHOD = (
    "the same random weights written as GGUF BF16 (the 1-D norm weights in F32, as "
    "llama.cpp's converter writes them), quantized by llama.cpp's llama_model_quantize "
    "to Q8_0 and Q4_0 with its default tensor mix (Q4_0 keeps the output head in Q6_K "
    "where its rows are a multiple of 256, else Q8_0); greedy decode through llama.cpp's "
    "C API (llama_decode, one sequence per batch row, the argmax of each row's logits) "
    "with the timing method of the other rows; MB read/step: the GGUF tensors' bytes, "
    "token_embd one row per sequence"
)


class NotConvertible(ValueError):
    """The model is not one this writer turns into a GGUF ``llama`` model."""


def missing_modules() -> list[str]:
    return [name for name in MODULES if importlib.util.find_spec(name) is None]


def versions() -> str:
    found = []
    for name in ("llama-cpp-python", "gguf"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found.append(f"{name} {importlib.metadata.version(name)}")
    return ", ".join(found)


# ---------------------------------------------------------------------------
# The model as GGUF: metadata, tensor names, q/k rows


@dataclass(frozen=True)
class Hyper:
    """What llama.cpp's ``llama`` architecture reads of the model."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    head_dim: int
    context: int
    rope_theta: float
    rms_eps: float
    tied: bool


def _rope_parameters(config) -> dict:
    rope = getattr(config, "rope_parameters", None)  # transformers 5
    if isinstance(rope, dict) and "full_attention" in rope:
        rope = rope["full_attention"]
    if not isinstance(rope, dict):
        rope = dict(getattr(config, "rope_scaling", None) or {})
        rope.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return rope


def hyperparameters(config) -> Hyper:
    """The GGUF hyperparameters of a Hugging Face Llama config;
    NotConvertible for what this writer does not handle (another family,
    biases, a RoPE scaling, a head size other than hidden / heads)."""
    if getattr(config, "model_type", None) != "llama":
        raise NotConvertible(f"model type {getattr(config, 'model_type', None)!r}, not 'llama'")
    for flag in ("attention_bias", "mlp_bias"):
        if getattr(config, flag, False):
            raise NotConvertible(f"{flag}=True")
    rope = _rope_parameters(config)
    if rope.get("rope_type", "default") != "default":
        raise NotConvertible(f"RoPE type {rope.get('rope_type')!r}")
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    if head_dim * heads != hidden:
        raise NotConvertible(f"head size {head_dim} x {heads} heads != hidden {hidden}")
    if head_dim % 2:
        raise NotConvertible(f"odd head size {head_dim}")
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return Hyper(
        vocab=config.vocab_size,
        hidden=hidden,
        layers=config.num_hidden_layers,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=config.intermediate_size,
        head_dim=head_dim,
        context=config.max_position_embeddings,
        rope_theta=float(rope["rope_theta"]),
        rms_eps=float(config.rms_norm_eps),
        tied=bool(getattr(config, "tie_word_embeddings", False)),
    )


def rope_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """q_proj or k_proj's rows in llama.cpp's order. Hugging Face's rotary
    embedding pairs channel i of a head with channel i + d/2 (rotate_half),
    llama.cpp's ``llama`` architecture channel 2i with 2i + 1: each head's
    rows (its two halves, d/2 each) interleaved, as llama.cpp's converter
    does (LlamaModel.permute)."""
    rows = weight.shape[0]
    if rows % (2 * heads):
        raise NotConvertible(f"{rows} rows are not {heads} heads of an even size")
    half = rows // heads // 2
    return (
        weight.reshape(heads, 2, half, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
        .contiguous()
    )


_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(name: str) -> str:
    """The GGUF tensor name of a LlamaForCausalLM state-dict entry."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in _LAYER_NAMES:
        return f"blk.{int(parts[2])}.{_LAYER_NAMES[parts[3]]}"
    raise NotConvertible(f"no GGUF name for {name!r}")


def gguf_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(GGUF name, tensor) of every weight llama.cpp reads: q and k in its
    row order, the head left out when it is tied to the embedding."""
    hyper = hyperparameters(model.config)
    for name, tensor in model.state_dict().items():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if name == "lm_head.weight" and hyper.tied:
            continue
        gguf = gguf_name(name)
        tensor = tensor.detach()
        if gguf.endswith("attn_q.weight"):
            tensor = rope_rows(tensor, hyper.heads)
        elif gguf.endswith("attn_k.weight"):
            tensor = rope_rows(tensor, hyper.kv_heads)
        yield gguf, tensor


def write_gguf(model: torch.nn.Module, path: str) -> None:
    """The model as a GGUF ``llama`` file: 2-D weights in BF16 (rounded
    from other dtypes), 1-D ones in F32, no tokenizer (``no_vocab``, the
    vocabulary size only)."""
    import gguf
    import numpy as np

    hyper = hyperparameters(model.config)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("fuseops bench --decode")
    writer.add_file_type(FTYPE_BF16)
    writer.add_vocab_size(hyper.vocab)
    writer.add_context_length(hyper.context)
    writer.add_embedding_length(hyper.hidden)
    writer.add_block_count(hyper.layers)
    writer.add_feed_forward_length(hyper.intermediate)
    writer.add_head_count(hyper.heads)
    writer.add_head_count_kv(hyper.kv_heads)
    writer.add_rope_dimension_count(hyper.head_dim)
    writer.add_rope_freq_base(hyper.rope_theta)
    writer.add_layer_norm_rms_eps(hyper.rms_eps)
    writer.add_tokenizer_model("no_vocab")
    for name, tensor in gguf_tensors(model):
        if tensor.dim() == 1:
            writer.add_tensor(name, tensor.float().numpy())
        else:
            bits = tensor.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            writer.add_tensor(name, bits, raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _quiet() -> None:
    """Silences llama.cpp's log (a line per tensor quantized): llama-cpp-python
    prints what its logger's level lets through, and maps llama.cpp's levels
    onto logging's as they were numbered before (its warnings come through
    as errors), so only CRITICAL keeps them out."""
    logging.getLogger("llama-cpp-python").setLevel(logging.CRITICAL)


def quantize(source: str, target: str, ftype: int, threads: int) -> None:
    """llama.cpp's quantizer, default parameters but the type and threads."""
    import llama_cpp

    _quiet()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    status = llama_cpp.llama_model_quantize(source.encode(), target.encode(), ctypes.byref(params))
    if status != 0:
        raise RuntimeError(f"llama_model_quantize to ftype {ftype} returned {status}")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: str
    shape: tuple[int, ...]  # GGUF order: the innermost dimension first
    bytes: int


def tensor_infos(path: str) -> list[TensorInfo]:
    import gguf

    reader = gguf.GGUFReader(path)
    return [
        TensorInfo(t.name, t.tensor_type.name, tuple(int(n) for n in t.shape), int(t.n_bytes))
        for t in reader.tensors
    ]


def bytes_read_per_step(tensors: Sequence[TensorInfo], batch: int) -> int:
    """Bytes of the GGUF tensors one decode step of `batch` sequences reads:
    every tensor once, token_embd one row per sequence (the rows of its
    outermost dimension; a head tied to it, without output.weight, reads
    it in full as well)."""
    total = 0
    tied = not any(t.name == "output.weight" for t in tensors)
    for t in tensors:
        if t.name == "token_embd.weight":
            total += batch * t.bytes // t.shape[-1]
            if tied:
                total += t.bytes
        else:
            total += t.bytes
    return total


def stored_bytes(tensors: Sequence[TensorInfo]) -> int:
    return sum(t.bytes for t in tensors)


# ---------------------------------------------------------------------------
# Decoding through llama.cpp's C API


class Model:
    """A GGUF file loaded by llama.cpp, with its default model parameters."""

    def __init__(self, path: str) -> None:
        import llama_cpp

        llama_cpp.llama_backend_init()
        self._api = llama_cpp
        # The ctypes handle of llama.cpp's model.
        self.handle: Any = llama_cpp.llama_model_load_from_file(
            path.encode(), llama_cpp.llama_model_default_params()
        )
        if not self.handle:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.handle))

    def close(self) -> None:
        if self.handle:
            self._api.llama_model_free(self.handle)
            self.handle = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Decoder:
    """A llama.cpp context of `model` for `batch` sequences of up to
    `positions` tokens each on `threads` threads (llama.cpp allocates its KV
    cache here); ``generate(ids, n)`` decodes greedily."""

    def __init__(self, model: Model, batch: int, positions: int, threads: int) -> None:
        api = self._api = model._api
        # The ctypes handles of llama.cpp's context and batch.
        self._context: Any = None
        self._batch: Any = None
        self.batch = batch
        self.vocab = model.vocab
        self._capacity = batch * positions
        params = api.llama_context_default_params()
        params.n_ctx = self._capacity
        params.n_batch = self._capacity
        params.n_seq_max = batch
        params.n_threads = params.n_threads_batch = threads
        self._context = api.llama_init_from_model(model.handle, params)
        if not self._context:
            raise RuntimeError(f"llama.cpp could not make a context of {batch} sequences")
        self._batch = api.llama_batch_init(self._capacity, 0, 1)

    def close(self) -> None:
        if self._batch is not None:
            self._api.llama_batch_free(self._batch)
            self._batch = None
        if self._context:
            self._api.llama_free(self._context)
            self._context = None

    def __enter__(self) -> "Decoder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _decode(self, tokens, start: int, logits: str):
        """Decodes tokens[s, j] at position start + j of sequence s; returns
        the logits of every position (logits="all") or of each sequence's
        last one ("last"), (batch, positions or 1, vocab)."""
        import numpy as np

        tokens = np.asarray(tokens, dtype=np.int64).reshape(self.batch, -1)
        length = tokens.shape[1]
        if start + length > self._capacity // self.batch or length == 0:
            raise ValueError(f"positions {start}..{start + length} out of the context")
        b = self._batch
        i = 0
        for s in range(self.batch):
            for j in range(length):
                b.token[i] = int(tokens[s, j])
                b.pos[i] = start + j
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = s
                b.logits[i] = logits == "all" or j == length - 1
                i += 1
        b.n_tokens = i
        status = self._api.llama_decode(self._context, b)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")
        rows = i if logits == "all" else self.batch
        values = np.ctypeslib.as_array(
            self._api.llama_get_logits(self._context), shape=(rows, self.vocab)
        )
        return values.reshape(self.batch, -1, self.vocab)

    def reset(self) -> None:
        self._api.llama_memory_clear(self._api.llama_get_memory(self._context), True)

    def logits(self, ids) -> "torch.Tensor":
        """The logits of every position of the prompts `ids` (batch, length)."""
        self.reset()
        return torch.from_numpy(self._decode(ids, 0, "all").copy())

    def generate(self, ids, new_tokens: int) -> "torch.Tensor":
        """Greedy decode of exactly `new_tokens` tokens after the prompts
        `ids` (batch, length), from an empty cache: the prompt's decode,
        whose logits give the first token, then new_tokens - 1 steps."""
        self.reset()
        length = ids.shape[1]
        out = torch.empty(self.batch, new_tokens, dtype=torch.int64)
        token = self._decode(ids, 0, "last")[:, -1].argmax(axis=-1)
        out[:, 0] = torch.from_numpy(token)
        for step in range(1, new_tokens):
            token = self._decode(token[:, None], length + step - 1, "last")[:, -1].argmax(axis=-1)
            out[:, step] = torch.from_numpy(token)
        return out


def convert(model: torch.nn.Module, folder: str, threads: int) -> dict[str, str]:
    """The model as GGUF files in `folder`, {"BF16": path, "Q8_0": path,
    "Q4_0": path}: written in BF16, quantized from it by llama.cpp."""
    paths = {name: os.path.join(folder, f"model-{name}.gguf") for name, _ in QUANTS}
    write_gguf(model, paths["BF16"])
    for name, ftype in QUANTS:
        if ftype is not None:
            quantize(paths["BF16"], paths[name], ftype, threads)
    return paths
