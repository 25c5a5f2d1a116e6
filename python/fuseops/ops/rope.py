"""rope: rotary position embedding of query and key (NeoX/Llama
``rotate_half`` pairs or GPT-J interleaved pairs, partial rotary, GQA), its
backward, an in-place form, and the cos/sin cache builder."""

from __future__ import annotations

import math
from typing import Optional

import torch

from ._out import call


def rope(
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
    interleaved: bool = False,
    *,
    out: Optional[torch.Tensor] = None,
    key_out: Optional[torch.Tensor] = None,
):
    """Rotary position embedding, as Hugging Face's ``apply_rotary_pos_emb``:
    ``x[..., :rd] * cos + rotate(x[..., :rd]) * sin`` for query and key, the
    rest of head_dim unchanged (partial rotary, ``rd = cos.shape[-1]``).

    ``query`` is ``[..., heads, head_dim]`` and ``key`` ``[..., kv_heads,
    head_dim]`` with the same leading (token) dimensions; views (e.g. slices
    of one fused qkv projection) are read in place. ``interleaved=False``
    rotates the pairs ``(j, j + rd/2)`` (NeoX, Llama: ``rotate_half``),
    ``True`` the pairs ``(2j, 2j+1)`` (GPT-J). With ``positions`` (int64 or
    int32, shape broadcastable to the token dimensions: ``[tokens]``,
    ``[batch, seq]``, ``[1, seq]``), ``cos``/``sin`` are ``[max_pos, rd]``
    caches (:func:`rope_cache`) and token t uses row ``positions[t]``; a
    position outside the cache is an error. Without ``positions`` they hold
    one row per token, ``[..., rd]`` broadcastable to the token dimensions
    (Hugging Face's ``position_embeddings``). Math is float32 (float64 for
    float64 input) whatever the cache's dtype.

    Returns ``(query_out, key_out)``, or the query's result alone when
    ``key`` is None. Differentiable in query and key; cos and sin must not
    require grad. With ``out=`` (and ``key_out=`` when there is a key) the
    results go into preallocated tensors, which may be ``query`` and ``key``
    themselves (see :func:`rope_`); that form is not differentiable.
    """
    rest = (cos, sin, positions, interleaved)
    return _run_rotation("rope", "key", query, key, rest, out, key_out)


def _run_rotation(name: str, key_name: str, x, key, rest: tuple, out, key_out):
    # rope and rope_backward alike: without a key (`key_name` in the caller's
    # words), the op's `single` overloads; preallocated results, both or
    # neither when there is a key.
    op = getattr(torch.ops.fuseops, name)
    if key is None:
        if key_out is not None:
            raise TypeError(f"fuseops.{name}: key_out= needs a {key_name}")
        return call(op, x, *rest, out=out, overload="single")
    if (out is None) != (key_out is None):
        raise TypeError(f"fuseops.{name}: pass both out= and key_out=, or neither")
    if out is None:
        return op(x, key, *rest)
    op.out(x, key, *rest, out=out, key_out=key_out)
    return out, key_out


def rope_(
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
    interleaved: bool = False,
):
    """:func:`rope` in place, for inference: rotates ``query`` and ``key``
    (strided views included, e.g. of one fused qkv tensor) and returns them
    (``query`` alone when ``key`` is None). ``query`` and ``key`` must not
    share elements (refused with an error)."""
    return rope(query, key, cos, sin, positions, interleaved, out=query, key_out=key)


def rope_backward(
    grad_query: torch.Tensor,
    grad_key: Optional[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
    interleaved: bool = False,
    *,
    out: Optional[torch.Tensor] = None,
    key_out: Optional[torch.Tensor] = None,
):
    """Gradients of :func:`rope` with respect to query and key: the
    transposed rotation ``g * cos + rotate^T(g * sin)`` (the rotation by
    -theta for the usual caches); the query's alone when ``grad_key`` is
    None. Differentiable (its derivative is :func:`rope`). ``out=`` and
    ``key_out=`` as in :func:`rope`: they may be ``grad_query`` and
    ``grad_key`` themselves (in place, as rope's autograd does with
    gradients nothing else refers to); that form is not differentiable."""
    rest = (cos, sin, positions, interleaved)
    return _run_rotation("rope_backward", "grad_key", grad_query, grad_key, rest, out, key_out)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim: int = 1):
    """Drop-in for Hugging Face's Llama-family ``apply_rotary_pos_emb``: ``q``
    ``[batch, heads, seq, head_dim]`` (``unsqueeze_dim=1``) or ``[batch,
    seq, heads, head_dim]`` (``unsqueeze_dim=2``), ``cos``/``sin`` the
    model's ``position_embeddings`` ``[batch, seq, head_dim]``
    (``position_ids`` is unused, as in Hugging Face). Returns
    ``(q_embed, k_embed)`` in q's and k's layout."""
    if unsqueeze_dim not in (1, 2):
        raise ValueError(
            f"fuseops.apply_rotary_pos_emb: unsqueeze_dim must be 1 or 2, got {unsqueeze_dim}"
        )
    if unsqueeze_dim == 1:
        q_out, k_out = rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    return rope(q, k, cos, sin)


def _inverse_frequencies(
    rotary_dim: int, base: float, scaling: Optional[str], factor: float, dtype
):
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(
            f"fuseops.rope_cache: rotary_dim must be a positive even number, got {rotary_dim}"
        )
    if scaling not in (None, "linear", "ntk"):
        raise ValueError(
            f"fuseops.rope_cache: scaling must be None, 'linear' or 'ntk', got {scaling!r}"
        )
    if scaling is not None and not factor > 0:
        raise ValueError(f"fuseops.rope_cache: factor must be positive, got {factor}")
    if scaling == "ntk" and rotary_dim > 2:
        # NTK-aware scaling stretches the base so that the lowest frequency
        # covers `factor` times the positions and the highest is unchanged.
        base = base * factor ** (rotary_dim / (rotary_dim - 2))
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    return (1.0 / base**exponents).to(dtype)


def rope_cache(
    rotary_dim: int,
    max_pos: int,
    base: float = 10000.0,
    scaling: Optional[str] = None,
    factor: float = 1.0,
    *,
    interleaved: bool = False,
    device=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each float32 ``[max_pos, rotary_dim]``, of the angles
    ``pos * base**(-2i/rotary_dim)``, in the layout Hugging Face builds:
    ``cat(freqs, freqs)`` for NeoX/Llama pairs, each frequency twice in a
    row (``repeat_interleave(freqs, 2)``) with ``interleaved=True`` (GPT-J).
    Angles are computed in float64 and rounded once. ``scaling="linear"``
    divides positions by ``factor`` (position interpolation);
    ``scaling="ntk"`` multiplies the base by ``factor**(rd/(rd-2))``
    (NTK-aware scaling)."""
    inv = _inverse_frequencies(rotary_dim, base, scaling, factor, torch.float64)
    positions = torch.arange(max_pos, dtype=torch.float64)
    if scaling == "linear":
        positions = positions / factor
    freqs = torch.outer(positions, inv)
    full = freqs.repeat_interleave(2, dim=-1) if interleaved else torch.cat([freqs, freqs], dim=-1)
    return (
        full.cos().to(device=device, dtype=torch.float32),
        full.sin().to(device=device, dtype=torch.float32),
    )


def _rotate(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if interleaved:
        pairs = x.unflatten(-1, (-1, 2))
        return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate_transposed(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    # rotate is antisymmetric: its transpose is -rotate.
    return -_rotate(x, interleaved)


def _gathered(x, table, positions):
    # HF casts cos/sin to the activations' dtype before the products.
    rows = table if positions is None else table[positions.long()]
    return rows.unsqueeze(-2).to(x.dtype)


def _apply(x, cos, sin, positions, interleaved, transposed):
    rd = cos.shape[-1]
    c, s = _gathered(x, cos, positions), _gathered(x, sin, positions)
    rot, rest = x[..., :rd], x[..., rd:]
    if transposed:
        rotated = rot * c + _rotate_transposed(rot * s, interleaved)
    else:
        rotated = rot * c + _rotate(rot, interleaved) * s
    return torch.cat((rotated, rest), dim=-1)


def _apply_with_optional_key(query, key, cos, sin, positions, interleaved, transposed):
    outs = [
        _apply(x, cos, sin, positions, interleaved, transposed)
        for x in (query, key)
        if x is not None
    ]
    return outs[0] if key is None else tuple(outs)


def rope_reference(query, key, cos, sin, positions=None, interleaved=False):
    # As Hugging Face writes it: q * cos + rotate_half(q) * sin, with the
    # cache rows gathered by position and cast to q's dtype.
    return _apply_with_optional_key(query, key, cos, sin, positions, interleaved, False)


def rope_backward_reference(grad_query, grad_key, cos, sin, positions=None, interleaved=False):
    return _apply_with_optional_key(grad_query, grad_key, cos, sin, positions, interleaved, True)


def rope_cache_reference(
    rotary_dim, max_pos, base=10000.0, scaling=None, factor=1.0, *, interleaved=False
):
    """rope_cache in float64, angle by angle with Python's math module."""
    if scaling == "ntk":
        base = base * factor ** (rotary_dim / (rotary_dim - 2))
    cos = torch.empty(max_pos, rotary_dim, dtype=torch.float64)
    sin = torch.empty_like(cos)
    for p in range(max_pos):
        pos = p / factor if scaling == "linear" else p
        for i in range(rotary_dim // 2):
            angle = pos * base ** (-2 * i / rotary_dim)
            for j in (2 * i, 2 * i + 1) if interleaved else (i, i + rotary_dim // 2):
                cos[p, j], sin[p, j] = math.cos(angle), math.sin(angle)
    return cos, sin


# --- bench -----------------------------------------------------------------

HEAD_DIM = 128
KV_GROUP = 4  # query heads per key head (GQA), as Llama 3 8B: 32 / 8


# --- conformance samples -----------------------------------------------------


# --- export: ONNX, ExecuTorch and their test calls (fuseops/ops/_export.py) ---


def _overloads_of(rope_one) -> dict:
    """rope's two overloads over ``rope_one(x, cos, sin, positions,
    interleaved)``, which rotates one tensor: what the ONNX translations and
    the ExecuTorch decompositions map."""

    def rope_pair(query, key, cos, sin, positions=None, interleaved: bool = False):
        """``fuseops::rope``: query and key rotated."""
        return (
            rope_one(query, cos, sin, positions, interleaved),
            rope_one(key, cos, sin, positions, interleaved),
        )

    def rope_single(input, cos, sin, positions=None, interleaved: bool = False):
        """``fuseops::rope.single``: rope without a key."""
        return rope_one(input, cos, sin, positions, interleaved)

    ops = torch.ops.fuseops
    return {ops.rope.default: rope_pair, ops.rope.single: rope_single}


def onnx_translations() -> dict:
    """rope and rope.single, decomposed (``Gather`` of the cache rows by
    position, ``Slice``, ``Neg``, ``Concat``, ``Mul``, ``Add``): the op takes
    full-width ``cos``/``sin`` rows of any values, which ONNX
    ``RotaryEmbedding``'s half-width caches cannot express. Partial rotary and
    GPT-J's interleaved pairs included; a negative position ``p >= -max_pos``
    is gathered as ``max_pos + p`` where the op raises."""
    from ._onnx import cast, dtype_of, ints, last_slice, op, opmath, static_dim

    def rotate(x, rotary_dim: int, interleaved: bool):
        """``rotate_half`` (pairs (j, j + rd/2)) or GPT-J's (pairs (2j, 2j+1))."""
        if interleaved:
            even = op.Unsqueeze(last_slice(x, 0, rotary_dim, 2), ints(-1))
            odd = op.Unsqueeze(last_slice(x, 1, rotary_dim, 2), ints(-1))
            return op.Reshape(op.Concat(op.Neg(odd), even, axis=-1), op.Shape(x))
        half = rotary_dim // 2
        return op.Concat(op.Neg(last_slice(x, half, rotary_dim)), last_slice(x, 0, half), axis=-1)

    def rope_one(x, cos, sin, positions, interleaved: bool):
        # As the kernel: the cache rows (gathered by position) in float32
        # whatever the cache's dtype, x[..., :rd] * cos + rotate(x[..., :rd])
        # * sin in float32, the rest of head_dim unchanged, rounded once.
        rotary_dim = static_dim(cos, -1, "the rotary dim (cos.shape[-1])")
        head_dim = static_dim(x, -1, "head_dim")
        dtype = dtype_of(x)
        ct = opmath(dtype)
        c, s = cos, sin
        if positions is not None:
            c, s = op.Gather(cos, positions, axis=0), op.Gather(sin, positions, axis=0)
        c = op.Unsqueeze(cast(c, ct), ints(-2))  # one row for all heads
        s = op.Unsqueeze(cast(s, ct), ints(-2))
        xc = cast(x, ct)
        rot = xc if rotary_dim == head_dim else last_slice(xc, 0, rotary_dim)
        rotated = op.Add(op.Mul(rot, c), op.Mul(rotate(rot, rotary_dim, interleaved), s))
        if rotary_dim != head_dim:
            rotated = op.Concat(rotated, last_slice(xc, rotary_dim, head_dim), axis=-1)
        return cast(rotated, dtype)

    return _overloads_of(rope_one)


def executorch_decompositions() -> dict:
    """rope and rope.single: the cache rows gathered by position (``index``,
    which takes a negative position ``p >= -max_pos`` as ``max_pos + p`` where
    the op raises), ``x * cos + rotate(x) * sin`` in float32, the rest of
    ``head_dim`` past the rotary dim unchanged; partial rotary and GPT-J's
    interleaved pairs included."""
    from ._executorch import opmath

    def rotate(x, interleaved: bool):
        """``rotate_half`` (pairs (j, j + rd/2)) or GPT-J's (pairs (2j, 2j+1))."""
        if interleaved:
            even, odd = x[..., 0::2], x[..., 1::2]
            return torch.stack((-odd, even), dim=-1).reshape(x.shape)
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def rope_one(x, cos, sin, positions, interleaved: bool):
        # As the kernel: the cache rows (gathered by position) in float32
        # whatever the cache's dtype, x[..., :rd] * cos + rotate(x[..., :rd])
        # * sin in float32, the rest of head_dim unchanged, rounded once.
        rotary_dim = cos.shape[-1]
        head_dim = x.shape[-1]
        dtype = x.dtype
        ct = opmath(dtype)
        c, s = cos, sin
        if positions is not None:
            index = positions.to(torch.int64)
            c, s = cos[index], sin[index]
        c = c.to(ct).unsqueeze(-2)  # one row for all heads
        s = s.to(ct).unsqueeze(-2)
        xc = x.to(ct)
        rot = xc if rotary_dim == head_dim else xc[..., :rotary_dim]
        rotated = rot * c + rotate(rot, interleaved) * s
        if rotary_dim != head_dim:
            rotated = torch.cat((rotated, xc[..., rotary_dim:]), dim=-1)
        return rotated.to(dtype)

    return _overloads_of(rope_one)


__all__ = ["apply_rotary_pos_emb", "rope", "rope_", "rope_backward", "rope_cache"]
