"""fuseops.relu / relu_backward against fuseops.reference and torch itself:
the numerics (opcheck, compilers, Meta, pybind, out= and every CPU build are
in test_conformance.py, fed by fuseops/ops/relu.py's samples).

relu is a select, so every dtype must match the reference exactly (no
tolerance): both produce either the input value or zero.
"""

from __future__ import annotations

import pytest
import torch

import fuseops
from fuseops import reference

from support.errors import expect_error_mentions
from support.params import DTYPES

SHAPES = [(0,), (), (1,), (7,), (3, 17), (5, 0, 3), (2, 3, 4, 5), (1000, 67)]


def with_special_values(x: torch.Tensor) -> torch.Tensor:
    flat = x.view(-1)
    specials = [0.0, -0.0, float("nan"), float("inf"), float("-inf")]
    flat[: len(specials)] = torch.tensor(specials[: flat.numel()], dtype=x.dtype, device=x.device)
    return x


def make_input(shape, dtype, layout, device="cpu"):
    def randn(s):
        return torch.randn(s, dtype=dtype, device=device)

    if layout == "contiguous":
        x = randn(shape)
    elif layout == "transposed":
        x = randn(tuple(reversed(shape))).transpose(0, -1) if len(shape) > 1 else randn(shape)
    elif layout == "sliced":
        x = randn(shape[:-1] + (shape[-1] * 2 + 1,))[..., 1::2] if shape else randn(shape)
    else:
        raise AssertionError(layout)
    if x.numel() >= 5 and x.is_contiguous():
        with_special_values(x)
    return x


def assert_identical(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_forward_matches_reference(dtype, shape, layout, device):
    x = make_input(shape, dtype, layout, device)
    y = fuseops.relu(x)
    assert_identical(y, reference.relu(x))
    assert_identical(y, torch.relu(x))
    assert y.is_contiguous()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_backward_matches_reference(dtype, shape, layout, device):
    result = torch.relu(make_input(shape, dtype, layout, device))
    grad = make_input(shape, dtype, layout, device)
    assert_identical(fuseops.relu_backward(grad, result), reference.relu_backward(grad, result))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_autograd_matches_torch(dtype, device):
    x = torch.randn(37, 19, dtype=dtype, device=device, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    upstream = torch.randn(37, 19, dtype=dtype, device=device)
    fuseops.relu(x).backward(upstream)
    torch.relu(x_ref).backward(upstream)
    assert_identical(x.grad, x_ref.grad)


def test_gradcheck_and_gradgradcheck_float64():
    # Away from 0, where relu is not differentiable and finite differences lie.
    x = torch.randn(6, 9, dtype=torch.float64)
    x = (x + x.sign() * 0.1).requires_grad_()
    assert torch.autograd.gradcheck(fuseops.relu, (x,))
    assert torch.autograd.gradgradcheck(fuseops.relu, (x,))


@pytest.mark.parametrize(
    "call, fragments",
    [
        (
            lambda: fuseops.relu(torch.ones(3, dtype=torch.int32)),
            ["fuseops::relu", "'input'", "Int"],
        ),
        (lambda: fuseops.relu(torch.ones(3, dtype=torch.complex64)), ["fuseops::relu", "'input'"]),
        (
            lambda: fuseops.relu_backward(torch.ones(3), torch.ones(4)),
            ["fuseops::relu_backward", "'grad_output'", "shape"],
        ),
        (
            lambda: fuseops.relu_backward(torch.ones(3), torch.ones(3, dtype=torch.float64)),
            ["fuseops::relu_backward", "'grad_output'", "dtype"],
        ),
    ],
)
def test_bad_input_errors_name_op_and_argument(call, fragments):
    expect_error_mentions(call, fragments)
