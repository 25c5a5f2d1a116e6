"""fuseops.relu / relu_backward against fuseops.reference and torch itself.

relu is a select, so every dtype must match the reference exactly (no
tolerance): both produce either the input value or zero.
"""

from __future__ import annotations

import pytest
import torch

import fuseops
from fuseops import reference

from conftest import DTYPES, expect_error_mentions

SHAPES = [(0,), (), (1,), (7,), (3, 17), (5, 0, 3), (2, 3, 4, 5), (1000, 67)]


def with_special_values(x: torch.Tensor) -> torch.Tensor:
    flat = x.view(-1)
    specials = [0.0, -0.0, float("nan"), float("inf"), float("-inf")]
    flat[: len(specials)] = torch.tensor(specials[: flat.numel()], dtype=x.dtype)
    return x


def make_input(shape, dtype, layout):
    if layout == "contiguous":
        x = torch.randn(shape, dtype=dtype)
    elif layout == "transposed":
        x = torch.randn(tuple(reversed(shape)), dtype=dtype).transpose(0, -1) if len(shape) > 1 else torch.randn(shape, dtype=dtype)
    elif layout == "sliced":
        x = torch.randn(shape[:-1] + (shape[-1] * 2 + 1,), dtype=dtype)[..., 1::2] if shape else torch.randn(shape, dtype=dtype)
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
def test_forward_matches_reference(dtype, shape, layout):
    x = make_input(shape, dtype, layout)
    y = fuseops.relu(x)
    assert_identical(y, reference.relu(x))
    assert_identical(y, torch.relu(x))
    assert y.is_contiguous()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_backward_matches_reference(dtype, shape, layout):
    result = torch.relu(make_input(shape, dtype, layout))
    grad = make_input(shape, dtype, layout)
    assert_identical(fuseops.relu_backward(grad, result), reference.relu_backward(grad, result))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_autograd_matches_torch(dtype):
    x = torch.randn(37, 19, dtype=dtype, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    upstream = torch.randn(37, 19, dtype=dtype)
    fuseops.relu(x).backward(upstream)
    torch.relu(x_ref).backward(upstream)
    assert_identical(x.grad, x_ref.grad)


def test_gradcheck_and_gradgradcheck_float64():
    # Away from 0, where relu is not differentiable and finite differences lie.
    x = torch.randn(6, 9, dtype=torch.float64)
    x = (x + x.sign() * 0.1).requires_grad_()
    assert torch.autograd.gradcheck(fuseops.relu, (x,))
    assert torch.autograd.gradgradcheck(fuseops.relu, (x,))


def test_out_variant():
    x = torch.randn(8, 5)
    out = torch.empty(8, 5)
    returned = fuseops.relu(x, out=out)
    assert returned.data_ptr() == out.data_ptr()
    assert_identical(out, torch.relu(x))
    strided_out = torch.empty(5, 8).t()
    fuseops.relu(x, out=strided_out)
    assert_identical(strided_out, torch.relu(x))


def test_opcheck_all_checks():
    x = torch.randn(5, 7)
    samples = [
        (torch.ops.fuseops.relu.default, (x,), {}),
        (torch.ops.fuseops.relu.default, (torch.randn(4, 3, requires_grad=True),), {}),
        (torch.ops.fuseops.relu.default, (torch.randn(3, 4, dtype=torch.bfloat16).t(),), {}),
        (torch.ops.fuseops.relu.out, (x,), {"out": torch.empty(5, 7)}),
        (torch.ops.fuseops.relu_backward.default, (torch.randn(5, 7), torch.relu(x)), {}),
        (
            torch.ops.fuseops.relu_backward.default,
            (torch.randn(5, 7, requires_grad=True), torch.relu(x)),
            {},
        ),
    ]
    for op, args, kwargs in samples:
        torch.library.opcheck(op, args, kwargs)


def test_torch_compile_fullgraph_no_graph_break():
    def f(x):
        return fuseops.relu(x * 2.0) + 1.0

    compiled = torch.compile(f, fullgraph=True, backend="inductor")
    x = torch.randn(16, 33)
    assert_identical(compiled(x), torch.relu(x * 2.0) + 1.0)


def test_torch_compile_backward():
    def f(x):
        return fuseops.relu(x).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    x = torch.randn(10, 10, requires_grad=True)
    compiled(x).backward()
    assert_identical(x.grad, (x.detach() > 0).float())


def test_torch_export_keeps_the_op():
    class M(torch.nn.Module):
        def forward(self, x):
            return fuseops.relu(x)

    exported = torch.export.export(M(), (torch.randn(3, 4),))
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert "fuseops.relu.default" in targets


def test_jit_trace():
    traced = torch.jit.trace(lambda x: fuseops.relu(x), (torch.randn(4, 4),))
    assert "fuseops::relu" in str(traced.graph)
    x = torch.randn(6, 2)
    assert_identical(traced(x), torch.relu(x))


def test_profiler_names_the_op():
    x = torch.randn(64, 64)
    with torch.profiler.profile() as prof:
        fuseops.relu(x)
    assert any(e.key == "fuseops::relu" for e in prof.key_averages())


def test_meta_tensors():
    x = torch.empty(4, 5, device="meta", dtype=torch.float16)
    y = fuseops.relu(x)
    assert y.device.type == "meta" and y.shape == (4, 5) and y.dtype == torch.float16


def test_pybind_path_equals_dispatcher_path():
    x = torch.randn(9, 31)
    assert_identical(fuseops._C.relu(x), torch.ops.fuseops.relu(x))
    g = torch.randn(9, 31)
    r = torch.relu(x)
    assert_identical(fuseops._C.relu_backward(g, r), torch.ops.fuseops.relu_backward(g, r))
    out = torch.empty(9, 31)
    fuseops._C.relu_out(x, out)
    assert_identical(out, torch.relu(x))
    # The C++ API carries autograd too.
    xg = torch.randn(5, requires_grad=True)
    fuseops._C.relu(xg).sum().backward()
    assert_identical(xg.grad, (xg.detach() > 0).float())


@pytest.mark.parametrize(
    "call, fragments",
    [
        (lambda: fuseops.relu(torch.ones(3, dtype=torch.int32)), ["fuseops::relu", "'input'", "Int"]),
        (lambda: fuseops.relu(torch.ones(3, dtype=torch.complex64)), ["fuseops::relu", "'input'"]),
        (
            lambda: fuseops.relu_backward(torch.ones(3), torch.ones(4)),
            ["fuseops::relu_backward", "'grad_output'", "shape"],
        ),
        (
            lambda: fuseops.relu_backward(torch.ones(3), torch.ones(3, dtype=torch.float64)),
            ["fuseops::relu_backward", "'grad_output'", "dtype"],
        ),
        (
            lambda: fuseops.relu(torch.ones(3), out=torch.empty(3, dtype=torch.float64)),
            ["fuseops::relu.out", "'out'", "dtype"],
        ),
    ],
)
def test_bad_input_errors_name_op_and_argument(call, fragments):
    expect_error_mentions(call, fragments)
