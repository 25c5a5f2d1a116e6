"""fuseops.causal_conv1d / causal_conv1d_update / fuseops.nn.CausalConv1d
against fuseops.reference (F.conv1d with groups=dim) in float64: the
numerics (opcheck, compilers, Meta, pybind, out= and every CPU build are in
test_conformance.py, fed by fuseops/ops/causal_conv1d.py's samples).

Tolerances, relative and absolute (inputs and outputs O(1)):
- float32/float64: 1e-5 of the float64 result; every output is a sum of at
  most 4 products and one SiLU, accumulated in float32 (float64).
- bfloat16/float16: fuseops computes in float32 and rounds once, so it
  matches the float64 result rounded to the dtype within one rounding step:
  1e-2 (bfloat16, 8-bit mantissa), 2e-3 (float16, 11-bit mantissa).
- grad_weight/grad_bias sum one term per (batch, time) row: their tolerance
  grows with sqrt(rows), as a sum's rounding error does.
"""

from __future__ import annotations

import math

import pytest
import torch

import fuseops
from fuseops import reference

from support.errors import expect_error_mentions
from support.params import DTYPES

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
CONFIGS = [(True, True, "silu"), (False, False, None), (True, False, "swish"), (False, True, None)]
LAYOUTS = ["contiguous", "channel_last", "channel_last_strided", "strided"]
# (batch, dim, seqlen): seqlen 1 and below the width, odd dims, vector
# tails, more than one channel-last chunk (128 steps) and tile (4096 channels).
SHAPES = [(2, 3, 1), (1, 5, 2), (2, 7, 3), (3, 33, 37), (2, 17, 300), (1, 4100, 20)]


def make_x(shape, dtype, layout, device="cpu", grad=False):
    batch, dim, seqlen = shape
    if layout == "contiguous":
        x = torch.randn(shape, dtype=dtype, device=device)
    elif layout == "channel_last":
        x = torch.randn(batch, seqlen, dim, dtype=dtype, device=device).transpose(1, 2)
    elif layout == "channel_last_strided":
        x = torch.randn(batch, seqlen, dim + 3, dtype=dtype, device=device)[
            ..., 1 : dim + 1
        ].transpose(1, 2)
    else:
        x = torch.randn(batch, dim, 2 * seqlen, dtype=dtype, device=device)[..., ::2]
    return x.requires_grad_(grad)


def assert_close(actual, expected, dtype, terms=1):
    tol = TOLERANCE[dtype] * math.sqrt(terms)
    assert actual.dtype == dtype
    torch.testing.assert_close(actual.double(), expected.to(dtype).double(), rtol=tol, atol=tol)


def double(t):
    return None if t is None else t.detach().double().requires_grad_(t.requires_grad)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("width", [2, 3, 4])
def test_forward_and_backward_match_float64_reference(device, dtype, layout, width):
    # Each shape with one combination of bias, initial states and
    # activation, rotating with the width: every combination meets every
    # shape over the three widths and the four-shape period.
    for index, shape in enumerate(SHAPES):
        for bias_on, init_on, activation in [CONFIGS[(index + width) % len(CONFIGS)]]:
            batch, dim, seqlen = shape
            x = make_x(shape, dtype, layout, device, grad=True)
            w = (0.5 * torch.randn(dim, width, dtype=dtype, device=device)).requires_grad_()
            b = (
                torch.randn(dim, dtype=dtype, device=device, requires_grad=True)
                if bias_on
                else None
            )
            init = (
                torch.randn(batch, dim, width - 1, dtype=dtype, device=device, requires_grad=True)
                if init_on
                else None
            )
            out, final = fuseops.causal_conv1d(x, w, b, init, True, activation)
            want_out, want_final = reference.causal_conv1d(
                double(x), double(w), double(b), double(init), True, activation
            )
            assert_close(out, want_out, dtype)
            assert_close(final, want_final, dtype)
            if layout.startswith("channel_last"):
                assert out.stride(1) == 1, "channel-last input gives channel-last output"

            dy = torch.randn_like(out)
            dfinal = torch.randn_like(final)
            leaves = [t for t in (x, w, b, init) if t is not None]
            got = torch.autograd.grad((out, final), leaves, (dy, dfinal))
            wide = [double(t) for t in (x, w, b, init) if t is not None]
            want_out, want_final = reference.causal_conv1d(
                wide[0],
                wide[1],
                wide[2] if bias_on else None,
                wide[-1] if init_on else None,
                True,
                activation,
            )
            want = torch.autograd.grad((want_out, want_final), wide, (dy.double(), dfinal.double()))
            rows = batch * seqlen
            for name, g, ref in zip(["x", "weight", "bias", "initial_states"], got, want):
                terms = rows if name in ("weight", "bias") else 1
                assert_close(g, ref, dtype, terms), name


def test_float32_weight_with_reduced_input(device):
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(2, 16, 50, dtype=dtype, device=device, requires_grad=True)
        w = torch.randn(16, 4, device=device, requires_grad=True)
        b = torch.randn(16, device=device, requires_grad=True)
        out = fuseops.causal_conv1d(x, w, b, activation="silu")
        assert out.dtype == dtype
        want = reference.causal_conv1d(x.double(), w.double(), b.double(), activation="silu")
        assert_close(out, want, dtype)
        out.sum().backward()
        assert w.grad.dtype == torch.float32 and b.grad.dtype == torch.float32


def test_gradcheck_float64(device):
    for layout in ("contiguous", "channel_last"):
        for seqlen in (1, 2, 9):
            x = make_x((2, 3, seqlen), torch.float64, layout, device, grad=True)
            w = torch.randn(3, 4, dtype=torch.float64, device=device, requires_grad=True)
            b = torch.randn(3, dtype=torch.float64, device=device, requires_grad=True)
            init = torch.randn(2, 3, 3, dtype=torch.float64, device=device, requires_grad=True)
            for activation in (None, "silu"):
                assert torch.autograd.gradcheck(
                    lambda *a: fuseops.causal_conv1d(*a, True, activation), (x, w, b, init)
                )
                assert torch.autograd.gradcheck(
                    lambda *a: fuseops.causal_conv1d(*a, activation=activation), (x, w, b)
                )


def test_update_matches_the_full_convolution_token_by_token(device):
    for dtype in DTYPES:
        for width in (2, 3, 4):
            for state_len in (width - 1, width + 1):
                batch, dim, seqlen = 2, 9, 11
                x = torch.randn(batch, dim, seqlen, dtype=dtype, device=device)
                w = torch.randn(dim, width, dtype=dtype, device=device)
                b = torch.randn(dim, dtype=dtype, device=device)
                full = reference.causal_conv1d(
                    x.double(), w.double(), b.double(), activation="silu"
                )
                state = torch.zeros(batch, dim, state_len, dtype=dtype, device=device)
                steps = [
                    fuseops.causal_conv1d_update(x[..., t], state, w, b, "silu")
                    for t in range(seqlen)
                ]
                assert_close(torch.stack(steps, -1), full, dtype)
                assert torch.equal(state, x[..., seqlen - state_len :])
                # Continuing from final states: the decode after a prefill.
                prefix = 5
                _, final = fuseops.causal_conv1d(x[..., :prefix], w, b, None, True, "silu")
                rest = fuseops.causal_conv1d_update(
                    x[..., prefix:], final.contiguous(), w, b, "silu"
                )
                assert_close(rest, full[..., prefix:], dtype)


def test_update_reference_semantics_and_strided_state(device):
    x = torch.randn(3, 8, 2, dtype=torch.float64, device=device)
    w = torch.randn(8, 4, dtype=torch.float64, device=device)
    state = torch.randn(3, 6, 8, dtype=torch.float64, device=device).transpose(1, 2)[:, :, :5]
    expected_state = state.clone()
    want = reference.causal_conv1d_update(x, expected_state, w, None, None)
    got = fuseops.causal_conv1d_update(x, state, w)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(state, expected_state)


def test_update_bumps_the_version_and_refuses_recorded_grad(device):
    state = torch.zeros(1, 4, 3, device=device)
    version = state._version
    fuseops.causal_conv1d_update(
        torch.randn(1, 4, device=device), state, torch.randn(4, 4, device=device)
    )
    assert state._version > version
    w = torch.randn(4, 4, device=device, requires_grad=True)
    expect_error_mentions(
        lambda: fuseops.causal_conv1d_update(torch.randn(1, 4, device=device), state, w),
        ["fuseops::causal_conv1d_update", "not differentiable"],
    )
    with torch.no_grad():
        fuseops.causal_conv1d_update(torch.randn(1, 4, device=device), state, w)
    with torch.inference_mode():
        s = torch.zeros(1, 4, 3, device=device)
        fuseops.causal_conv1d_update(torch.randn(1, 4, device=device), s, w)


def test_empty_inputs(device):
    for shape in [(0, 4, 5), (2, 0, 5), (2, 4, 0)]:
        x = torch.randn(shape, device=device, requires_grad=True)
        w = torch.randn(shape[1], 4, device=device, requires_grad=True)
        init = torch.randn(shape[0], shape[1], 3, device=device, requires_grad=True)
        out, final = fuseops.causal_conv1d(x, w, None, init, True, "silu")
        assert out.shape == shape
        torch.testing.assert_close(final, torch.cat([init, x], -1)[..., -3:])
        (out.sum() + final.sum()).backward()
        assert torch.equal(w.grad, torch.zeros_like(w))
        assert torch.equal(
            init.grad, torch.ones_like(init) if shape[2] == 0 else torch.zeros_like(init)
        )


def test_out_overlapping_input_is_computed(device):
    buf = torch.randn(2, 4, 12, dtype=torch.float64, device=device)
    x = buf[..., :10]
    w = torch.randn(4, 3, dtype=torch.float64, device=device)
    want = reference.causal_conv1d(x.clone(), w)
    fuseops.causal_conv1d(x, w, out=buf[..., 2:])
    torch.testing.assert_close(buf[..., 2:], want)
    x = torch.randn(2, 4, 10, dtype=torch.float64, device=device)
    want = reference.causal_conv1d(x.clone(), w, activation="silu")
    fuseops.causal_conv1d(x, w, activation="silu", out=x)
    torch.testing.assert_close(x, want)


def test_module(device):
    torch.manual_seed(0)
    module = fuseops.nn.CausalConv1d(6, 4, activation="silu").to(device).double()
    plain = torch.nn.Conv1d(6, 6, 4, groups=6, padding=3).to(device).double()
    plain.load_state_dict(module.state_dict())
    x = torch.randn(2, 6, 10, dtype=torch.float64, device=device, requires_grad=True)
    out = module(x)
    want = torch.nn.functional.silu(plain(x)[..., :10])
    torch.testing.assert_close(out, want)
    init = torch.randn(2, 6, 3, dtype=torch.float64, device=device)
    torch.testing.assert_close(
        module(x, init),
        reference.causal_conv1d(x, module.weight.squeeze(1), module.bias, init, activation="silu"),
    )
    out.sum().backward()
    assert module.weight.grad.shape == (6, 1, 4)
    with pytest.raises(ValueError, match="CausalConv1d: activation"):
        fuseops.nn.CausalConv1d(6, 4, activation="relu")


def test_bad_inputs(device):
    x = torch.randn(2, 4, 8, device=device)
    w = torch.randn(4, 4, device=device)
    cases = [
        (
            lambda: fuseops.causal_conv1d(x, torch.randn(4, 5, device=device)),
            ["fuseops::causal_conv1d", "'weight'", "2, 3 or 4", "got 5"],
        ),
        (
            lambda: fuseops.causal_conv1d(x, w, activation="gelu"),
            ["fuseops::causal_conv1d", "'activation'", "'gelu'"],
        ),
        (
            lambda: fuseops.causal_conv1d(x, w.double()),
            ["fuseops::causal_conv1d", "'weight'", "dtype"],
        ),
        (lambda: fuseops.causal_conv1d(x[0], w), ["fuseops::causal_conv1d", "'x'", "3 dimensions"]),
        (
            lambda: fuseops.causal_conv1d(x, w, None, torch.randn(2, 4, 4, device=device)),
            ["fuseops::causal_conv1d", "'initial_states'", "(2, 4, 3)"],
        ),
        (
            lambda: fuseops.causal_conv1d_backward(x[..., :3], x, w, None, None, None, None),
            ["fuseops::causal_conv1d_backward", "'grad_output'", "shape"],
        ),
        (
            lambda: fuseops.causal_conv1d_update(x, torch.zeros(2, 4, 2, device=device), w),
            ["fuseops::causal_conv1d_update", "'conv_state'", "state_len"],
        ),
        (
            lambda: fuseops.causal_conv1d_update(
                x[..., 0], torch.zeros(2, 4, 3, device=device).double(), w
            ),
            ["fuseops::causal_conv1d_update", "'conv_state'", "dtype"],
        ),
    ]
    for call, fragments in cases:
        expect_error_mentions(call, fragments)
    with pytest.raises(ValueError, match="fuseops.causal_conv1d: out= .* return_final_states"):
        fuseops.causal_conv1d(x, w, None, None, True, None, out=torch.empty_like(x))
    buf = torch.zeros(2, 4, 6, device=device)
    expect_error_mentions(
        lambda: fuseops.causal_conv1d_update(buf[..., 5], buf[..., :3], w),
        ["fuseops::causal_conv1d_update", "'x'", "'conv_state'", "shares memory"],
    )
    expect_error_mentions(
        lambda: fuseops.causal_conv1d_update(
            x[..., 0], torch.zeros(2, 4, 1, device=device).expand(2, 4, 3), w
        ),
        ["fuseops::causal_conv1d_update", "'conv_state'"],
    )
