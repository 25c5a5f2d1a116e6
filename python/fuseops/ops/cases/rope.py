"""The test and bench cases of :mod:`fuseops.ops.rope` (see
:mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import rope as family
from ._sample import DTYPES, Sample, tensor


def _heads(hidden: int) -> tuple[int, int]:
    heads = max(1, hidden // family.HEAD_DIM)
    return heads, max(1, heads // family.KV_GROUP)


@dataclass(frozen=True)
class _QkTraffic:
    """Bytes of `passes` reads or writes of q ([rows, heads, 128], hidden =
    heads * 128) and k (heads / 4 heads); the gathered cos/sin rows (float32,
    one row per token for all heads) are left out like per-row statistics."""

    passes: int

    def bytes(self, rows: int, hidden: int, element_size: int) -> int:
        heads, kv_heads = _heads(hidden)
        return element_size * self.passes * rows * (heads + kv_heads) * family.HEAD_DIM


def _bench_inputs(rows, hidden, dtype, device, gen):
    heads, kv_heads = _heads(hidden)
    q = torch.randn(rows, heads, family.HEAD_DIM, dtype=dtype, device=device, generator=gen)
    k = torch.randn(rows, kv_heads, family.HEAD_DIM, dtype=dtype, device=device, generator=gen)
    cos, sin = family.rope_cache(family.HEAD_DIM, rows, device=device)
    positions = torch.arange(rows, device=device)
    return q, k, cos, sin, positions


def _rope_out(fn, args, options, outs):
    fn(*args, **options, out=outs[0], key_out=outs[1])


def bench_cases():
    from ._bench_case import Case

    return [
        Case(
            "rope",
            "rope",
            "rope",
            _bench_inputs,
            forward_traffic=_QkTraffic(passes=2),  # q, k in; q_out, k_out out
            backward_traffic=_QkTraffic(passes=2),  # dq_out, dk_out in; dq, dk out
            differentiable=(0, 1),
            call_out=_rope_out,
            description="rotary embedding of q [rows, hidden/128, 128] and k (a quarter of "
            "the heads), positions 0..rows-1, float32 cache",
        ),
    ]


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    ops, tokens, interleaved = torch.ops.fuseops, d.shape(1, 2, hi=5), d.flag()
    head_dim = 2 * d.int(1, 8)
    rotary, max_pos, dtype = 2 * d.int(1, head_dim // 2), d.int(1, 40), d.dtype()
    q = d.tensor(tokens + (d.int(1, 4), head_dim), dtype, grad=True)
    k = d.maybe(lambda: d.tensor(tokens + (d.int(1, 3), head_dim), dtype, grad=True))
    cached, table_dtype = (
        d.flag(),
        d.choice((torch.float32, dtype)),
    )  # a cache and positions, or one row per token
    cos, sin = (d.tensor(((max_pos,) if cached else tokens) + (rotary,), table_dtype) for _ in "cs")
    positions = (
        d.integers(tokens, 0, max_pos, d.choice((torch.int64, torch.int32))) if cached else None
    )
    rest = (cos, sin, positions, interleaved)
    forward, wrapper = (
        (ops.rope, family.rope) if d.flag() else (ops.rope_backward, family.rope_backward)
    )
    if k is None:
        return Sample(forward.single, (q, *rest), wrapper, wrapper_args=(q, None, *rest))
    return Sample(forward.default, (q, k, *rest), wrapper)


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops

    def t(shape, dtype=torch.float32, layout="contiguous", grad=False):
        return tensor(shape, dtype, device, layout, grad)

    cos, sin = family.rope_cache(16, 32, device=device)
    cos_i, sin_i = family.rope_cache(8, 32, interleaved=True, device=device)
    positions = torch.tensor([3, 0, 31, 7, 7], device=device)
    batch_positions = torch.tensor([[0, 1, 2], [5, 9, 30]], device=device, dtype=torch.int32)
    q, k = t((5, 4, 16)), t((5, 2, 16))
    # q and k as views of one fused [tokens, (4 + 2 + 2) * 16] projection.
    qkv = t((5, 8 * 16))
    view_q = qkv[:, : 4 * 16].view(5, 4, 16).detach().requires_grad_()
    view_k = qkv[:, 4 * 16 : 6 * 16].view(5, 2, 16)
    per_token_cos, per_token_sin = cos[positions], sin[positions]

    def single(op, tensors, rest, kwargs=None, large=False):
        wrapper = family.rope_backward if op._schema.name.endswith("_backward") else family.rope
        return Sample(
            op,
            (*tensors, *rest),
            wrapper,
            kwargs or {},
            wrapper_args=(tensors[0], None, *rest),
            large=large,
        )

    result = [
        Sample(ops.rope.default, (q, k, cos, sin, positions, False), family.rope),
        Sample(
            ops.rope.default,
            (t((5, 4, 16), grad=True), t((5, 1, 16), grad=True), cos_i, sin_i, positions, True),
            family.rope,
        ),
        Sample(ops.rope.default, (view_q, view_k, cos, sin, positions, False), family.rope),
        Sample(
            ops.rope.default,
            (
                t((2, 3, 2, 16), torch.bfloat16, grad=True),
                t((2, 3, 1, 16), torch.bfloat16),
                cos,
                sin,
                batch_positions,
                False,
            ),
            family.rope,
        ),
        Sample(
            ops.rope.default,
            (
                t((5, 2, 16), torch.float16, "sliced"),
                t((5, 2, 16), torch.float16, "transposed"),
                cos,
                sin,
                positions,
                False,
            ),
            family.rope,
        ),
        Sample(
            ops.rope.default,
            (
                t((5, 3, 24), torch.float64, grad=True),
                t((5, 1, 24), torch.float64, grad=True),
                per_token_cos,
                per_token_sin,
                None,
                False,
            ),
            family.rope,
        ),
        Sample(
            ops.rope.default,
            (t((0, 3, 16), grad=True), t((0, 1, 16), grad=True), cos, sin, positions[:0], False),
            family.rope,
        ),
        single(
            ops.rope.single,
            (t((5, 2, 16), torch.bfloat16, grad=True),),
            (cos.bfloat16(), sin.bfloat16(), positions, False),
        ),
        single(
            ops.rope.single,
            (t((4, 3, 12), torch.float32, "expanded"),),
            (cos_i, sin_i, positions[:4], True),
        ),
        Sample(
            ops.rope.out,
            (q, k, cos, sin, positions, False),
            family.rope,
            {
                "out": torch.empty(5, 4, 16, device=device),
                "key_out": torch.empty(5, 2, 16, device=device),
            },
        ),
        single(
            ops.rope.single_out,
            (q,),
            (cos_i, sin_i, positions, True),
            {"out": torch.empty(5, 4, 16, device=device)},
        ),
        Sample(
            ops.rope_backward.default,
            (t((5, 4, 16)), t((5, 2, 16)), cos, sin, positions, False),
            family.rope_backward,
        ),
        Sample(
            ops.rope_backward.default,
            (t((5, 4, 16), grad=True), t((5, 2, 16)), cos_i, sin_i, positions, True),
            family.rope_backward,
        ),
        single(
            ops.rope_backward.single,
            (t((5, 2, 16), torch.float16),),
            (per_token_cos, per_token_sin, None, False),
        ),
        Sample(
            ops.rope_backward.out,
            (t((5, 4, 16)), t((5, 2, 16)), cos, sin, positions, False),
            family.rope_backward,
            {
                "out": torch.empty(5, 4, 16, device=device),
                "key_out": torch.empty(5, 2, 16, device=device),
            },
        ),
        single(
            ops.rope_backward.single_out,
            (t((5, 2, 16)),),
            (cos_i, sin_i, positions, True),
            {"out": torch.empty(5, 2, 16, device=device)},
        ),
    ]
    # 301 tokens, 3 + 1 heads, head_dim 70 (several tasks per thread, a vector
    # tail in every half row) and a partial rotary of 40, both layouts. The
    # float64 reference converts every tensor input to float64, so these use
    # per-token cos/sin rows (no integer positions).
    full_cos, full_sin = family.rope_cache(70, 301, device=device)
    part_cos, part_sin = family.rope_cache(40, 301, interleaved=True, device=device)
    for dtype in DTYPES:
        result += [
            Sample(
                ops.rope.default,
                (
                    t((301, 3, 70), dtype, grad=True),
                    t((301, 1, 70), dtype, grad=True),
                    full_cos,
                    full_sin,
                    None,
                    False,
                ),
                family.rope,
                large=True,
            ),
            Sample(
                ops.rope.default,
                (
                    t((301, 3, 70), dtype, grad=True),
                    t((301, 1, 70), dtype, grad=True),
                    part_cos,
                    part_sin,
                    None,
                    True,
                ),
                family.rope,
                large=True,
            ),
        ]
    return result


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py)."""
    from .._export import EXPORT_DTYPES, ExportCase
    from .._export import randn as t

    rope = torch.ops.fuseops.rope
    cos, sin = family.rope_cache(16, 32)
    cos_i, sin_i = family.rope_cache(8, 32, interleaved=True)
    positions = torch.tensor([3, 0, 31, 7, 7])
    batch_positions = torch.tensor([[0, 1, 2], [5, 9, 30]], dtype=torch.int32)
    cases = []
    for dtype in EXPORT_DTYPES:
        cases += [
            # NeoX/Llama pairs, full rotary, a cache and positions, GQA.
            ExportCase(
                rope.default,
                f"{dtype} neox positions",
                (t(5, 4, 16, dtype=dtype), t(5, 2, 16, dtype=dtype), cos, sin, positions),
                lambda q, k, c, s, p: rope(q, k, c, s, p, False),
            ),
            # GPT-J pairs on the first 8 of 16 dims, positions [batch, seq] int32.
            ExportCase(
                rope.default,
                f"{dtype} gptj partial, int32 positions [batch, seq]",
                (
                    t(2, 3, 4, 16, dtype=dtype),
                    t(2, 3, 1, 16, dtype=dtype),
                    cos_i,
                    sin_i,
                    batch_positions,
                ),
                lambda q, k, c, s, p: rope(q, k, c, s, p, True),
            ),
            # One row per token (Hugging Face's position_embeddings), a
            # cache in x's dtype, no key.
            ExportCase(
                rope.single,
                f"{dtype} per-token rows, single",
                (
                    t(2, 3, 4, 16, dtype=dtype),
                    cos[batch_positions.long()].to(dtype),
                    sin[batch_positions.long()].to(dtype),
                ),
                lambda x, c, s: rope.single(x, c, s, None, False),
            ),
            # cos/sin rows of any values (not a rotation), partial rotary.
            ExportCase(
                rope.single,
                f"{dtype} arbitrary rows, partial, single",
                (t(5, 2, 24, dtype=dtype), t(9, 12), t(9, 12), torch.tensor([8, 0, 1, 4, 4])),
                lambda x, c, s, p: rope.single(x, c, s, p, False),
            ),
        ]
    return cases
