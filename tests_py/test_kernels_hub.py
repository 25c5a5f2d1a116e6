"""``fuseops.kernels_hub``: fuseops layers through Hugging Face's ``kernels``
package (``kernelize`` with ``fuseops.kernels_hub.kernel_mapping()``).

transformers 5.23 marks its RMSNorm classes for ``kernels`` only when the
installed ``kernels`` is a version it accepts (0.18.2 up to 0.19); with an
older one its marks are no-ops. The tests mark Llama's RMSNorm through
``kernels``' own API (``replace_kernel_forward_from_hub``, undone after each
test), which is what transformers' decorator does with a version it accepts.

Float32 results differ from HF's RMSNorm by the order of float32 sums inside
the op (about 1e-7 relative): the bounds are 1e-5 relative.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install 'fuseops[transformers]')"
)
kernels = pytest.importorskip("kernels", reason="kernels is not installed (pip install kernels)")

import fuseops.kernels_hub as kernels_hub  # noqa: E402
from support.tiny_llama import CONFIG, VOCAB  # noqa: E402

BOUND = 1e-5


@pytest.fixture
def marked(monkeypatch):
    from transformers.models.llama import modeling_llama

    cls = modeling_llama.LlamaRMSNorm
    monkeypatch.setattr(cls, "kernel_layer_name", "RMSNorm", raising=False)
    monkeypatch.setattr(cls, "kernel_condition", staticmethod(lambda module: True), raising=False)
    return cls


def models():
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
    return ref, copy.deepcopy(ref)


def kernelized(model, mode):
    with kernels.use_kernel_mapping(kernels_hub.kernel_mapping()):
        kernels.kernelize(model, device="cpu", mode=mode)
    return model


def fuseops_ops(fn) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events() if e.name.startswith("fuseops::")}


def ids():
    return torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def test_kernelize_training_runs_fuseops_rms_norm(marked):
    ref, model = models()
    kernelized(model, kernels.Mode.TRAINING)
    tokens = ids()
    want = ref(input_ids=tokens, labels=tokens)
    ran = fuseops_ops(lambda: model(input_ids=tokens, labels=tokens))
    assert "fuseops::rms_norm" in ran, ran
    got = model(input_ids=tokens, labels=tokens)
    assert abs(got.loss.item() - want.loss.item()) <= BOUND * want.loss.item()
    want.loss.backward()
    got.loss.backward()
    for (name, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        assert relative(b.grad, a.grad) <= BOUND, name
    # The unkernelized copy of the same class runs HF's forward.
    assert not fuseops_ops(lambda: ref(input_ids=tokens))


def test_kernelize_inference_and_torch_compile(marked):
    ref, model = models()
    kernelized(model, kernels.Mode.INFERENCE | kernels.Mode.TORCH_COMPILE)
    tokens = ids()
    with torch.no_grad():
        want = ref(input_ids=tokens).logits
        got = torch.compile(model, fullgraph=True)(input_ids=tokens).logits
    assert relative(got, want) <= BOUND
    assert "fuseops::rms_norm" in fuseops_ops(lambda: model(input_ids=tokens))


def test_mapping_and_layer_follow_the_kernels_rules():
    mapping = kernels_hub.kernel_mapping()
    assert set(mapping) == {"RMSNorm"}
    assert set(mapping["RMSNorm"]) == {"cpu", "cuda"}
    [repo] = mapping["RMSNorm"]["cpu"].values()
    layer = repo.load()
    assert layer is kernels_hub.RMSNorm and layer.has_backward and layer.can_torch_compile
    assert layer.__init__ is torch.nn.Module.__init__  # stateless, as kernels requires
