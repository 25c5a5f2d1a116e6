"""int8 linear layers: weight packing, the W8A16 linear
(``int8_weight_only_linear``) and the W8A8 dynamic one
(``int8_dynamic_linear``), plus ``quantize_``, which swaps a model's
``nn.Linear`` layers for ``fuseops.nn.Int8Linear``.

Weights are quantized per output channel (``quantize_per_channel_int8``),
then packed (``pack_int8_weight``) into the layout the kernels stream:
``packed[b, g, c, j] = wq[16*b + c, 4*g + j]`` (int8, shape
``[ceil(N/16), ceil(K/4), 16, 4]``, zeros past N and K), kept with the
float32 scales ``[N]`` and the int32 per-channel sums ``colsum[n] =
sum_k wq[n, k]`` (the int8-activation kernels' correction for activations
shifted to unsigned). All three are
ordinary tensors: a module keeps them as buffers, ``state_dict`` round-trips
them, and ``torch.compile``/``torch.export`` see plain tensors.

These are inference ops: they have no derivative, and called on tensors that
require grad with grad mode on they raise (use ``torch.no_grad()`` or
``torch.inference_mode()``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from ._export import PREPARES_WEIGHTS
from ._sample import Sample, tensor

if TYPE_CHECKING:
    from ._bench_case import CaseFields


def pack_int8_weight(
    wq: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(packed, scale, colsum)`` of an int8 weight ``wq [N, K]`` with
    per-channel float32 ``scale [N]`` (module docstring for the layout)."""
    return torch.ops.fuseops.pack_int8_weight(wq, scale)


def int8_weight_only_linear(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``x @ (wq * scale[:, None]).T + bias`` with the packed int8 weight:
    ``x [..., K]`` float32, bfloat16, float16 or float64, result ``[..., N]``
    in x's dtype. Products are summed in float32 (float64 activations are
    rounded to float32) and each channel's scale is applied once to its sum:
    ``y[m, n] = scale[n] * sum_k x[m, k] * wq[n, k] + bias[n]``."""
    return torch.ops.fuseops.int8_weight_only_linear(x, packed, scale, bias)


def int8_dynamic_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale: torch.Tensor,
    colsum: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """W8A8 dynamic: ``x [..., K]`` (float32, bfloat16, float16 or float64)
    quantized per row on the fly exactly as ``quantize_per_token_int8`` does
    (``x_scale = absmax / 127``, ``xq = round(x / x_scale)``), the int8
    products summed exactly in int32, then ``y[m, n] = (acc[m, n] *
    x_scale[m]) * scale[n] + bias[n]`` in float32 (float64 for float64 x),
    rounded to x's dtype. ``(packed, scale, colsum)`` as
    ``pack_int8_weight`` returns them; K at most 132104 (int32 sums). A row
    holding Inf or NaN gives a row of NaN."""
    return torch.ops.fuseops.int8_dynamic_linear(x, packed, scale, colsum, bias)


def unpack_int8_weight(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The ``[n, k]`` weight a packed tensor holds (in packed's dtype)."""
    blocks, groups = packed.shape[:2]
    return packed.permute(0, 2, 1, 3).reshape(blocks * 16, groups * 4)[:n, :k]


def pack_int8_weight_reference(wq: torch.Tensor, scale: torch.Tensor):
    n, k = wq.shape
    blocks, groups = -(-n // 16), -(-k // 4)
    padded = torch.nn.functional.pad(wq, (0, 4 * groups - k, 0, 16 * blocks - n))
    packed = padded.view(blocks, 16, groups, 4).permute(0, 2, 1, 3).contiguous()
    return packed, scale.clone(), wq.to(torch.int64).sum(1).to(torch.int32)


def int8_weight_only_linear_reference(x, packed, scale, bias=None):
    # In x's dtype, which the conformance suite and the bench make float64
    # (float32 for reduced-precision rows): a weight dequantized exactly.
    w = unpack_int8_weight(packed, scale.shape[0], x.shape[-1]).to(x.dtype)
    y = (x @ w.T) * scale.to(x.dtype)
    return y if bias is None else y + bias.to(x.dtype)


def int8_dynamic_linear_reference(x, packed, scale, colsum, bias=None):
    # The quantized math in float64: the rows quantized in float32 exactly as
    # the op does (float64 inputs rounded to float32 first), the int8
    # products summed exactly (|sum| < 2^53), the scales applied in float64.
    from .quantize import quantize_per_token_int8_reference

    xq, x_scale = quantize_per_token_int8_reference(x)
    w = unpack_int8_weight(packed, scale.shape[0], x.shape[-1]).to(torch.float64)
    y = (
        (xq.to(torch.float64) @ w.T)
        * x_scale.to(torch.float64).unsqueeze(-1)
        * scale.to(torch.float64)
    )
    y = y if bias is None else y + bias.to(torch.float64)
    return y.to(x.dtype)


def _peer_weight(packed, scale, n, k, dtype, form):
    from ._bench_case import peer_form

    def make():
        wq = unpack_int8_weight(packed, n, k).contiguous()
        if form == "float":
            return ((wq.to(torch.float32) * scale[:, None]).to(dtype),)
        return (wq, scale.to(dtype))

    return peer_form(packed, (form, dtype), make)


def _f_linear(x, packed, scale):
    (w,) = _peer_weight(packed, scale, scale.shape[0], x.shape[-1], x.dtype, "float")
    return torch.nn.functional.linear(x, w)


def _weight_int8pack_mm(x, packed, scale):
    wq, s = _peer_weight(packed, scale, scale.shape[0], x.shape[-1], x.dtype, "int8")
    return torch._weight_int8pack_mm(x, wq, s)


def _dynamic_peer_weight(packed, scale, n, k, engine):
    # torch.ao's dynamic Linear with the same per-channel int8 weight; it
    # quantizes activations per tensor (uint8, asymmetric) at run time.
    from ._bench_case import peer_form

    def make():
        import warnings

        import torch.ao.nn.quantized.dynamic as nnqd

        torch.backends.quantized.engine = engine
        wq = unpack_int8_weight(packed, n, k).contiguous()
        # torch.ao's quantized tensors are deprecated (a UserWarning).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch._make_per_channel_quantized_tensor(
                wq, scale.double(), torch.zeros(n, dtype=torch.long), 0
            )
            module = nnqd.Linear(k, n, bias_=False)
            module.set_weight_bias(qweight, None)
        return (module,)

    return peer_form(packed, ("ao", engine), make)


def _ao_dynamic_linear(engine):
    def peer(x, packed, scale, colsum):
        (module,) = _dynamic_peer_weight(packed, scale, scale.shape[0], x.shape[-1], engine)
        # The engine is process-wide: set it for each call (a cheap store).
        torch.backends.quantized.engine = engine
        return module(x.float()).to(x.dtype)

    return peer


def _int_mm(x, packed, scale, colsum):
    # torch._int_mm on activations quantized beforehand (per token, as the
    # op does, outside the timing) and the int8 weight [K, N]: the int8
    # GEMM alone plus the scales' epilogue.
    from ._bench_case import peer_form

    def make():
        xq, x_scale = torch.ops.fuseops.quantize_per_token_int8(x)
        wq = unpack_int8_weight(packed, scale.shape[0], x.shape[-1]).contiguous()
        return xq, x_scale.unsqueeze(-1), wq

    # Kept with the activations; `packed` belongs to the same input set.
    xq, x_scale, wq = peer_form(x, ("int_mm", id(packed)), make)
    return (torch._int_mm(xq, wq.t()).float() * x_scale * scale).to(x.dtype)


def _x_and_weight(rows, hidden, dtype, device, gen):
    """Activations [rows, hidden] and a packed int8 weight [hidden, hidden]
    quantized from a random one."""
    x = torch.randn(rows, hidden, dtype=torch.float32, device=device, generator=gen).to(dtype)
    w = torch.randn(hidden, hidden, dtype=torch.float32, device=device, generator=gen) * 0.02
    packed, scale, _ = pack_int8_weight(*torch.ops.fuseops.quantize_per_channel_int8(w))
    return x, packed, scale


def _x_and_dynamic_weight(rows, hidden, dtype, device, gen):
    x = torch.randn(rows, hidden, dtype=torch.float32, device=device, generator=gen).to(dtype)
    w = torch.randn(hidden, hidden, dtype=torch.float32, device=device, generator=gen) * 0.02
    return (x, *pack_int8_weight(*torch.ops.fuseops.quantize_per_channel_int8(w)))


def _f_linear_dynamic(x, packed, scale, colsum):
    return _f_linear(x, packed, scale)


def bench_cases():
    from ._bench_case import Case, Traffic

    # rows = tokens (M), hidden = in = out features (K = N): decode (M = 1,
    # 8), a short prefill (32) and a batch (256); the quick preset's one row
    # the short prefill. The full shapes' int8 weight (64 MiB) exceeds the
    # cache; the other presets' (4 MiB) rotate through input sets that
    # together do.
    shapes = {
        "quick": [(32, 2048)],
        "standard": [(m, 2048) for m in (1, 8, 32, 256)],
        "full": [(m, 8192) for m in (1, 8, 32, 256)],
    }
    # x read and y written in the dtype; the int8 weight and its float32
    # scales read once.
    traffic = Traffic(rows=2, extra=lambda rows, hidden: hidden * hidden + 4 * hidden)
    common: CaseFields = dict(
        fuseops="int8_weight_only_linear",
        reference="int8_weight_only_linear",
        make_inputs=_x_and_weight,
        forward_traffic=traffic,
        backward_traffic=Traffic(rows=0),
        has_out=False,
        differentiable=(),
        shapes=shapes,
    )
    # W8A8: the same traffic plus the int32 column sums.
    dynamic: CaseFields = {
        **common,
        "fuseops": "int8_dynamic_linear",
        "reference": "int8_dynamic_linear",
        "make_inputs": _x_and_dynamic_weight,
        "forward_traffic": Traffic(rows=2, extra=lambda rows, hidden: hidden * hidden + 8 * hidden),
    }
    return [
        Case(
            "int8_dynamic_linear",
            native=_f_linear_dynamic,
            native_label="F.linear (dequantized weight)",
            description="W8A8 dynamic: x quantized per token, int8 x int8 in int32",
            **dynamic,
        ),
        Case(
            "int8_dynamic_linear_ao_fbgemm",
            native=_ao_dynamic_linear("fbgemm"),
            native_label="torch.ao dynamic Linear (fbgemm)",
            description="W8A8 against torch.ao.nn.quantized.dynamic.Linear, fbgemm engine",
            **dynamic,
        ),
        Case(
            "int8_dynamic_linear_ao_onednn",
            native=_ao_dynamic_linear("onednn"),
            native_label="torch.ao dynamic Linear (onednn)",
            description="W8A8 against torch.ao.nn.quantized.dynamic.Linear, onednn engine",
            **dynamic,
        ),
        Case(
            "int8_dynamic_linear_int_mm",
            native=_int_mm,
            native_label="torch._int_mm (x pre-quantized)",
            description="W8A8 against ATen's int8 matmul on pre-quantized activations",
            **dynamic,
        ),
        Case(
            "int8_weight_only_linear",
            native=_f_linear,
            native_label="F.linear (dequantized weight)",
            description="W8A16: x @ (wq * scale).T, int8 weight per channel",
            **common,
        ),
        Case(
            "int8_weight_only_linear_int8pack",
            native=_weight_int8pack_mm,
            native_label="torch._weight_int8pack_mm",
            description="W8A16 against ATen's int8 weight-only matmul",
            **common,
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops
    gen = torch.Generator(device="cpu").manual_seed(1)

    def weight(n, k):
        wq = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen).to(device)
        scale = (torch.rand(n, generator=gen) * 0.02 + 1e-3).to(device)
        return wq, scale

    def packed(n, k):
        return pack_int8_weight(*weight(n, k))[:2]

    def t(shape, dtype=torch.float32, layout="contiguous"):
        return tensor(shape, dtype, device, layout)

    w37, s37 = packed(37, 10)
    result = [
        Sample(ops.pack_int8_weight.default, weight(37, 10), pack_int8_weight),
        Sample(ops.pack_int8_weight.default, weight(16, 4), pack_int8_weight),
        Sample(ops.pack_int8_weight.default, weight(0, 5), pack_int8_weight),
        Sample(
            ops.int8_weight_only_linear.default,
            (t((3, 10)), w37, s37, None),
            int8_weight_only_linear,
        ),
        Sample(
            ops.int8_weight_only_linear.default,
            (t((3, 10)), w37, s37, t((37,))),
            int8_weight_only_linear,
        ),
        Sample(
            ops.int8_weight_only_linear.default,
            (t((2, 4, 10), torch.bfloat16, "transposed"), w37, s37, t((37,), torch.bfloat16)),
            int8_weight_only_linear,
        ),
        Sample(
            ops.int8_weight_only_linear.default,
            (t((5, 10), torch.float16, "sliced"), w37, s37, None),
            int8_weight_only_linear,
        ),
        Sample(
            ops.int8_weight_only_linear.default,
            (t((10,), torch.float64), w37, s37, None),
            int8_weight_only_linear,
        ),
        Sample(
            ops.int8_weight_only_linear.default,
            (t((0, 10)), w37, s37, None),
            int8_weight_only_linear,
        ),
        Sample(
            ops.int8_weight_only_linear.default,
            (t((3, 0)), *packed(5, 0), t((5,))),
            int8_weight_only_linear,
        ),
    ]
    wd = pack_int8_weight(*weight(37, 10))
    zero_rows = t((4, 10))
    zero_rows[1] = 0  # scale 1, the bias alone
    result += [
        Sample(ops.int8_dynamic_linear.default, (t((3, 10)), *wd, None), int8_dynamic_linear),
        Sample(ops.int8_dynamic_linear.default, (zero_rows, *wd, t((37,))), int8_dynamic_linear),
        Sample(
            ops.int8_dynamic_linear.default,
            (t((2, 4, 10), torch.bfloat16, "transposed"), *wd, t((37,), torch.bfloat16)),
            int8_dynamic_linear,
        ),
        Sample(
            ops.int8_dynamic_linear.default,
            (t((5, 10), torch.float16, "sliced"), *wd, None),
            int8_dynamic_linear,
        ),
        Sample(
            ops.int8_dynamic_linear.default,
            (t((10,), torch.float64), *wd, None),
            int8_dynamic_linear,
        ),
        Sample(ops.int8_dynamic_linear.default, (t((0, 10)), *wd, None), int8_dynamic_linear),
        Sample(
            ops.int8_dynamic_linear.default,
            (t((3, 0)), *pack_int8_weight(*weight(5, 0)), t((5,))),
            int8_dynamic_linear,
        ),
    ]
    # Every CPU build: more rows than a register tile and than a task's
    # chunk (the widened-weight path), partial blocks of channels and groups.
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        wp, sp = packed(37, 129)
        for m in (1, 5, 61):
            result.append(
                Sample(
                    ops.int8_weight_only_linear.default,
                    (t((m, 129), dtype), wp, sp, t((37,), dtype)),
                    int8_weight_only_linear,
                    large=True,
                )
            )
        # W8A8: one tile, several, several chunks and slices of 128 groups
        # (K = 600: 150 groups).
        wd = pack_int8_weight(*weight(37, 600))
        for m in (1, 5, 61):
            result.append(
                Sample(
                    ops.int8_dynamic_linear.default,
                    (t((m, 600), dtype), *wd, t((37,), dtype)),
                    int8_dynamic_linear,
                    large=True,
                )
            )
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    ops, n, k = torch.ops.fuseops, d.size(40), d.size(40)
    wq, scale = d.integers((n, k), -127, 128, torch.int8), d.tensor((n,), torch.float32, 0.02)
    kind = d.int(0, 2)
    if kind == 0:
        return Sample(ops.pack_int8_weight.default, (wq, scale), pack_int8_weight)
    x = d.tensor(d.shape(0, 2) + (k,))
    bias = d.maybe(lambda: d.tensor((n,), x.dtype))
    packed, scale, colsum = pack_int8_weight(wq, scale)
    d.math_dtype = torch.float32  # float64 x is summed in float32
    if kind == 1:
        return Sample(
            ops.int8_weight_only_linear.default, (x, packed, scale, bias), int8_weight_only_linear
        )
    return Sample(
        ops.int8_dynamic_linear.default, (x, packed, scale, colsum, bias), int8_dynamic_linear
    )


# --- export: ONNX, ExecuTorch and their test calls (fuseops/ops/_export.py) ---

NOT_EXPORTED = {("pack_int8_weight",): PREPARES_WEIGHTS}


def onnx_translations() -> dict:
    """The int8 linears: the packed weight unpacked with ONNX operators
    (``Transpose``, ``Reshape``, ``Slice``); the weight-only one dequantizes
    it in float32 for ``MatMul``, the dynamic one quantizes the activations
    per row as the op does (``absmax / 127``, ``Round`` half to even) and sums
    the int8 products exactly in int32 with ``MatMulInteger``
    (``DynamicQuantizeLinear`` does not apply: it quantizes a whole tensor
    asymmetrically to uint8)."""
    from ._onnx import FLOAT, add_bias, cast, dtype_of, dynamic_int8_linear, ints, op, static_dim

    def unpack(packed, n: int, k: int):
        """The ``[n, k]`` int8 weight of ``pack_int8_weight``'s layout
        ``[ceil(N/16), ceil(K/4), 16, 4]``."""
        blocks = static_dim(packed, 0, "packed.shape[0]")
        groups = static_dim(packed, 1, "packed.shape[1]")
        w = op.Reshape(op.Transpose(packed, perm=[0, 2, 1, 3]), ints(blocks * 16, groups * 4))
        return op.Slice(w, ints(0, 0), ints(n, k), ints(0, 1))

    def int8_weight_only_linear_onnx(input, packed, scale, bias=None):
        """``fuseops::int8_weight_only_linear``: ``x @ wq.T * scale + bias`` in
        float32, the int8 weight unpacked and cast to float32 (exact), the
        channel's scale applied to each sum as the op does."""
        n = static_dim(scale, 0, "the output features (scale.shape[0])")
        k = static_dim(input, -1, "the input features")
        w = op.Cast(unpack(packed, n, k), to=FLOAT)
        y = op.Mul(op.MatMul(cast(input, FLOAT), op.Transpose(w, perm=[1, 0])), cast(scale, FLOAT))
        return cast(add_bias(y, bias, FLOAT), dtype_of(input))

    def int8_dynamic_linear_onnx(input, packed, scale, colsum, bias=None):
        """``fuseops::int8_dynamic_linear``: the rows quantized as the op does,
        ``MatMulInteger`` (exact int32 sums), then ``(acc * x_scale) * scale +
        bias`` in float32 (float64 for float64 input). ``colsum`` is the op's
        correction for its unsigned activations: unused here."""
        del colsum
        n = static_dim(scale, 0, "the output features (scale.shape[0])")
        k = static_dim(input, -1, "the input features")
        return dynamic_int8_linear(input, unpack(packed, n, k), scale, bias)

    ops = torch.ops.fuseops
    return {
        ops.int8_weight_only_linear.default: int8_weight_only_linear_onnx,
        ops.int8_dynamic_linear.default: int8_dynamic_linear_onnx,
    }


def executorch_decompositions() -> dict:
    """The int8 linears: the packed weight unpacked (permute, reshape,
    slice); the weight-only one dequantizes it in float32 for the product,
    the dynamic one quantizes the activations per row as the op does
    (``absmax / 127``, round half to even, clamp to [-127, 127]) and sums
    the integer products exactly (in float64, exact for the int8 ranges). The
    ``.pte`` keeps the packed int8 bytes."""
    from ._executorch import add_bias, dynamic_int8_linear, rows_times

    def unpack(packed, n: int, k: int):
        """The ``[n, k]`` int8 weight of ``pack_int8_weight``'s layout
        ``[ceil(N/16), ceil(K/4), 16, 4]``."""
        blocks, groups = packed.shape[0], packed.shape[1]
        return packed.permute(0, 2, 1, 3).reshape(blocks * 16, groups * 4)[:n, :k]

    def int8_weight_only_linear_decomposition(input, packed, scale, bias=None):
        """``fuseops::int8_weight_only_linear``: ``x @ wq.T * scale + bias`` in
        float32, the int8 weight unpacked and cast to float32 (exact), the
        channel's scale applied to each sum as the op does."""
        n, k = scale.shape[0], input.shape[-1]
        w = unpack(packed, n, k).to(torch.float32)
        x2d = input.to(torch.float32).reshape(-1, k)
        y = rows_times(x2d, w, input.shape[:-1] + (n,)) * scale.to(torch.float32)
        return add_bias(y, bias, torch.float32).to(input.dtype)

    def int8_dynamic_linear_decomposition(input, packed, scale, colsum, bias=None):
        """``fuseops::int8_dynamic_linear``: the rows quantized as the op does,
        the int8 products summed exactly (float64), then ``(acc * x_scale) *
        scale + bias`` in float32 (float64 for float64 input). ``colsum`` is
        the op's correction for its unsigned activations: unused here."""
        del colsum
        return dynamic_int8_linear(
            input, unpack(packed, scale.shape[0], input.shape[-1]), scale, bias
        )

    ops = torch.ops.fuseops
    return {
        ops.int8_weight_only_linear.default: int8_weight_only_linear_decomposition,
        ops.int8_dynamic_linear.default: int8_dynamic_linear_decomposition,
    }


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py): the
    weight-only linear within 1e-5 (its float sums over K run in another
    order), the dynamic one as float32 (equal int32 sums, the epilogue's
    float32 order apart)."""
    import itertools

    from ._export import EXPORT_DTYPES, ExportCase
    from ._export import randn as t
    from .quantize import quantize_per_channel_int8

    ops = torch.ops.fuseops

    def weight(n, k):
        return pack_int8_weight(*quantize_per_channel_int8(torch.randn(n, k) * 0.05))

    cases = []
    for dtype, (m, n, k), bias in itertools.product(
        EXPORT_DTYPES, ((3, 20, 37), (1, 16, 64)), (False, True)
    ):
        packed, scale, _ = weight(n, k)
        args = (t(2, m, k, dtype=dtype), packed, scale) + ((t(n, dtype=dtype),) if bias else ())
        label = f"{dtype} {m}x{k} @ {n} bias={bias}"
        cases.append(
            ExportCase(ops.int8_weight_only_linear.default, label, args, rtol=1e-5, atol=1e-5)
        )
    for dtype, (m, n, k), bias in itertools.product(
        EXPORT_DTYPES, ((3, 20, 37), (1, 16, 64)), (False, True)
    ):
        args = (t(2, m, k, dtype=dtype), *weight(n, k)) + ((t(n, dtype=dtype),) if bias else ())
        label = f"{dtype} {m}x{k} @ {n} bias={bias}"
        cases.append(ExportCase(ops.int8_dynamic_linear.default, label, args))
    # A row of zeros (scale 1), a row holding Inf and one holding NaN (NaN rows).
    x = t(4, 32)
    x[1] = 0
    x[2, 5] = float("inf")
    x[3, 0] = float("nan")
    cases.append(
        ExportCase(ops.int8_dynamic_linear.default, "zero, Inf and NaN rows", (x, *weight(8, 32)))
    )
    return cases


__all__ = [
    "int8_dynamic_linear",
    "int8_weight_only_linear",
    "pack_int8_weight",
    "unpack_int8_weight",
]
