"""Deployment without Python: a model built from fuseops modules, exported
with torch.export, compiled and packaged by AOTInductor, run from Python
(aoti_load_package) and from a C++ program (tests_cpp/aoti) that links
fuseops::fuseops and loads the package with
torch::inductor::AOTIModelPackageLoader; both give eager's outputs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import fuseops
import fuseops.nn as fnn

# torch 2.13's AOTInductor packaging deep-copies pytree specs through
# typing_extensions, which warns about torch's own deprecated LeafSpec check.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning"
)

AOTI_PROJECT = Path(__file__).resolve().parents[1] / "tests_cpp" / "aoti"
SHAPE = (2, 8, 32)  # batch, seq, dim
HEADS = 4


class Model(torch.nn.Module):
    """One call of each fuseops op family that has a module, on a shape
    small enough that AOTInductor compiles it in seconds."""

    def __init__(self) -> None:
        super().__init__()
        dim, seq = SHAPE[2], SHAPE[1]
        self.norm = fnn.RMSNorm(dim)
        self.rope = fnn.RotaryEmbedding(dim // HEADS, max_position_embeddings=seq, grow=False)
        self.conv = fnn.CausalConv1d(dim, width=4, activation="silu")
        self.ln = fnn.LayerNorm(dim)
        self.swiglu = fnn.SwiGLU(dim, 2 * dim)
        self.geglu = fnn.GeGLU(dim, dim, approximate="tanh")
        self.gelu = fnn.GELU()
        self.silu = fnn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        h = self.norm(x).view(batch, seq, HEADS, dim // HEADS)
        positions = torch.arange(seq, device=x.device).expand(batch, seq)
        q, k = self.rope(h, h, positions)
        x = x + (q * k).reshape(batch, seq, dim)
        x = x + self.conv(x.transpose(1, 2)).transpose(1, 2)
        h = self.ln(x)
        return fuseops.relu(x + self.swiglu(h) + self.gelu(self.geglu(h)) - self.silu(h))


def fuseops_ops_in(graph_module: torch.fx.GraphModule) -> set[str]:
    return {
        str(node.target).split(".")[1]
        for node in graph_module.graph.nodes
        if node.op == "call_function" and str(node.target).startswith("fuseops.")
    }


@pytest.fixture(scope="module")
def model_and_input():
    torch.manual_seed(0)
    return Model().eval(), torch.randn(SHAPE)


@pytest.fixture(scope="module")
def package(model_and_input, tmp_path_factory) -> Path:
    model, x = model_and_input
    exported = torch.export.export(model, (x,))
    path = tmp_path_factory.mktemp("aoti") / "model.pt2"
    return Path(torch._inductor.aoti_compile_and_package(exported, package_path=str(path)))


# float32 throughout; Inductor compiles the torch ops around the fuseops calls
# (fusing and reordering their arithmetic), so results may differ from eager
# by float32 rounding (~1e-7 relative per op, a few dozen ops here).
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def test_export_keeps_the_fuseops_ops(model_and_input):
    model, x = model_and_input
    exported = torch.export.export(model, (x,))
    # The ops stay opaque calls in the exported graph (not decomposed into
    # torch ops), so what is deployed is fuseops' kernels.
    assert fuseops_ops_in(exported.graph_module) >= {
        "rms_norm",
        "rope",
        "causal_conv1d",
        "layer_norm",
        "swiglu",
        "geglu",
        "gelu",
        "silu",
        "relu",
    }
    torch.testing.assert_close(exported.module()(x), model(x), rtol=0, atol=0)


def test_aoti_package_runs_from_python(model_and_input, package):
    model, x = model_and_input
    loaded = torch._inductor.aoti_load_package(str(package))
    torch.testing.assert_close(loaded(x), model(x), **TOLERANCE)


@pytest.mark.slow
def test_aoti_package_runs_from_cpp(model_and_input, package, tmp_path):
    model, x = model_and_input
    cmake = shutil.which("cmake")
    assert cmake, "cmake is not on PATH"

    def run(*args, **kwargs):
        result = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)
        assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
        return result

    build = tmp_path / "build"
    run(
        cmake,
        "-S",
        str(AOTI_PROJECT),
        "-B",
        str(build),
        "-G",
        "Ninja",
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_PREFIX_PATH={fuseops.cmake_prefix_path}",
    )
    run(cmake, "--build", str(build))
    input_file, output_file = tmp_path / "input.bin", tmp_path / "output.bin"
    x.numpy().tofile(input_file)
    # No LD_LIBRARY_PATH: the program finds torch and fuseops by its RPATH.
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    result = run(
        str(build / "aoti_run"),
        str(package),
        str(input_file),
        str(output_file),
        *map(str, SHAPE),
        env=env,
    )
    assert f"fuseops {fuseops.__version__}" in result.stdout, result.stdout
    expected = model(x)
    got = torch.from_file(str(output_file), size=expected.numel(), dtype=torch.float32)
    torch.testing.assert_close(got.view(expected.shape), expected, **TOLERANCE)


class Scripted(torch.nn.Module):
    """TorchScript sees the ops through torch.ops (the Python wrappers and
    fuseops.nn modules are not scriptable)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(SHAPE[2]) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.fuseops.relu(torch.ops.fuseops.rms_norm(x, self.weight, 1e-6))


def test_torchscript_of_torch_ops_fuseops_saves_and_loads(tmp_path):
    model, x = Scripted(), torch.randn(SHAPE)
    scripted = torch.jit.script(model)
    assert "fuseops::rms_norm" in str(scripted.graph)
    scripted.save(str(tmp_path / "model.pt"))
    loaded = torch.jit.load(str(tmp_path / "model.pt"))
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
