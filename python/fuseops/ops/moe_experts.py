"""moe_experts: the routed experts of a mixture-of-experts layer in one op
(each token's top-k gated MLPs, weighted by the router and summed), in the
weight layout of transformers' experts classes, with its backward op."""

from __future__ import annotations

from typing import Optional

import torch

#: The ``activation`` names and the activation each means.
ACTIVATIONS = {
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
}


def moe_experts(
    hidden: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    """The routed experts of a mixture-of-experts layer, differentiable in
    ``hidden``, ``top_k_weights`` and both weights::

        out[t] = sum_k top_k_weights[t, k] * down_proj[e] @ (act(gate) * up),
        e = top_k_index[t, k], [gate | up] = gate_up_proj[e] @ hidden[t]

    ``hidden`` [T, H]; ``top_k_index`` [T, K] (int64 or int32, each in [0,
    E)); ``top_k_weights`` [T, K] (any floating dtype); ``gate_up_proj`` [E,
    2I, H] with each expert's gate rows first and ``down_proj`` [E, H, I]
    (transformers' experts layout; any strides, so ``w.transpose(1, 2)`` of
    a transposed layout is read in place), of ``hidden``'s dtype.
    ``activation``: ``"silu"``, ``"gelu"`` or ``"gelu_tanh"``.

    The tokens are sorted by expert; each expert runs three matrix products
    on the rows routed to it, and each token's K results are summed in the
    order of k (so the result does not depend on the number of threads).
    bfloat16/float16 inputs compute in float32 (products, activation, the
    weighted sum) and round the result once; transformers' loop rounds each
    product and each expert's contribution to the dtype. Only an expert given
    fewer than 32 rows (decoding) runs its products through
    :func:`fuseops.linear`'s streaming kernel in the dtype (its weight read
    once, not widened), rounding them as transformers' loop does. The backward
    reads every pair's first product as the forward kept it
    (:func:`moe_experts_forward`) and skips the experts' weight gradients when
    neither weight requires grad."""
    return torch.ops.fuseops.moe_experts(
        hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, activation
    )


def moe_experts_forward(
    hidden: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    activation: str = "silu",
):
    """``(out, gate_up_out)``: :func:`moe_experts` and every (token, k)
    pair's first product ``gate_up_proj[e] @ hidden[t]``, ``[T * K, 2I]`` in
    the compute dtype (float32 for bfloat16/float16), its rows sorted by
    expert (stably): what :func:`moe_experts_backward` reads instead of
    recomputing it, and what moe_experts' autograd keeps. Not
    differentiable."""
    return torch.ops.fuseops.moe_experts_forward(
        hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, activation
    )


def moe_experts_backward(
    grad_output: torch.Tensor,
    hidden: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    activation: str = "silu",
    expert_grads: bool = True,
    gate_up_out: Optional[torch.Tensor] = None,
):
    """``(grad_hidden, grad_top_k_weights, grad_gate_up_proj,
    grad_down_proj)`` of :func:`moe_experts`; with ``expert_grads=False``
    the last two are empty (``[0]``) and not computed (frozen experts).
    ``gate_up_out`` (:func:`moe_experts_forward`'s second result) saves one
    product per expert; without it the first product is recomputed."""
    return torch.ops.fuseops.moe_experts_backward(
        grad_output,
        hidden,
        top_k_index,
        top_k_weights,
        gate_up_proj,
        down_proj,
        activation,
        expert_grads,
        gate_up_out,
    )


def moe_experts_reference(
    hidden: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    # transformers' eager experts loop (integrations/moe.py): the experts hit,
    # in increasing order, each on its tokens, weighted and added into the
    # output in its dtype.
    act = ACTIVATIONS[activation]
    top_k_index = top_k_index.long()
    # Zeros that are part of hidden's graph (with no pair routed, the result
    # still has a gradient: zero), whatever hidden holds (NaN included).
    out = torch.where(torch.zeros_like(hidden, dtype=torch.bool), hidden, 0)
    for expert in torch.unique(top_k_index).tolist():
        token, slot = torch.where(top_k_index == expert)
        gate, up = torch.nn.functional.linear(hidden[token], gate_up_proj[expert]).chunk(2, -1)
        result = torch.nn.functional.linear(act(gate) * up, down_proj[expert])
        weighted = result * top_k_weights[token, slot, None]
        out = out.index_add(0, token, weighted.to(out.dtype))
    return out


def moe_experts_grouped_mm(
    hidden: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    """The grouped path torch offers, as transformers' ``"grouped_mm"``
    experts spell it: the pairs sorted by expert, ``torch._grouped_mm`` for
    each of the two products over all experts at once, the weighted rows
    summed per token (the bench's peer)."""
    tokens, top_k = top_k_index.shape
    experts = gate_up_proj.shape[0]
    order = top_k_index.reshape(-1).argsort(stable=True)
    rows = hidden[order // top_k]
    counts = torch.bincount(top_k_index.reshape(-1), minlength=experts)
    offsets = counts.cumsum(0).to(torch.int32)
    gate, up = torch._grouped_mm(rows, gate_up_proj.transpose(1, 2), offs=offsets).chunk(2, -1)
    result = torch._grouped_mm(
        ACTIVATIONS[activation](gate) * up, down_proj.transpose(1, 2), offs=offsets
    )
    weighted = result * top_k_weights.reshape(-1)[order, None]
    unsorted = torch.empty_like(weighted).index_copy(0, order, weighted)
    return unsorted.view(tokens, top_k, -1).sum(1).to(hidden.dtype)


# --- export: ONNX, ExecuTorch and their test calls (fuseops/ops/_export.py) ---
#
# An exported graph has static shapes, and the op's sort of the tokens by
# expert has data-dependent sizes. So both export forms are dense: every
# expert runs on every token, and each token keeps the results of the
# experts it is routed to, weighted (E / K times the op's products: a form
# for exporting small mixture-of-experts models, not for speed). An index
# outside [0, E), which the op refuses, routes its token nowhere.


def _check_export_activation(where: str, activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"{where}: moe_experts' activation must be one of {sorted(ACTIVATIONS)}, "
            f"got {activation!r}"
        )


def onnx_translations() -> dict:
    """moe_experts, dense: for each expert, ``MatMul`` of every token by its
    ``gate_up_proj`` and ``down_proj`` slices (``Gather``), the activation
    (``Sigmoid`` for SiLU, ONNX ``Gelu``), and the sum over the token's
    slots routed to it of their weights; a token's result adds the weighted
    results of its experts only (``Where``), in float32 (float64 for
    float64 inputs)."""
    from onnxscript import ir

    from ._onnx import INT64, cast, dtype_of, gelu_math, ints, op, opmath, silu_math, static_dim

    def moe_experts_onnx(
        hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, activation: str = "silu"
    ):
        """``fuseops::moe_experts``, every expert on every token, each
        token's routed results weighted and summed."""
        _check_export_activation("fuseops.onnx", activation)
        dtype = dtype_of(hidden)
        ct = opmath(dtype)
        experts = static_dim(gate_up_proj, 0, "the experts (gate_up_proj.shape[0])")
        inter = static_dim(down_proj, 2, "the intermediate size (down_proj.shape[2])")
        x = cast(hidden, ct)
        index = op.Cast(top_k_index, to=INT64)
        weights = cast(top_k_weights, ct)
        zero = op.Constant(value=ir.tensor(0.0, dtype=ct))
        out = None
        for e in range(experts):
            expert = op.Constant(value=ir.tensor(e, dtype=INT64))
            routed = op.Equal(index, expert)  # [T, K]
            weight = op.ReduceSum(op.Where(routed, weights, zero), ints(1), keepdims=1)
            hit = op.ReduceMax(op.Cast(routed, to=INT64), ints(1), keepdims=1)  # [T, 1]
            gate_up = op.MatMul(
                x, op.Transpose(cast(op.Gather(gate_up_proj, expert, axis=0), ct), perm=[1, 0])
            )
            gate = op.Slice(gate_up, ints(0), ints(inter), ints(-1))
            up = op.Slice(gate_up, ints(inter), ints(2 * inter), ints(-1))
            if activation == "silu":
                act = silu_math(gate)
            else:
                act = gelu_math(gate, "tanh" if activation == "gelu_tanh" else "none")
            down = cast(op.Gather(down_proj, expert, axis=0), ct)
            result = op.MatMul(op.Mul(act, up), op.Transpose(down, perm=[1, 0]))
            term = op.Where(op.Cast(hit, to=ir.DataType.BOOL), op.Mul(result, weight), zero)
            out = term if out is None else op.Add(out, term)
        return cast(out, dtype)

    return {torch.ops.fuseops.moe_experts.default: moe_experts_onnx}


def executorch_decompositions() -> dict:
    """moe_experts, dense (see :func:`onnx_translations`): ``torch.mm`` of
    every token by each expert's weights, the activation, and each token's
    routed results weighted and summed, in float32 (float64 for float64)."""
    from ._executorch import gelu_math, opmath, silu_math

    def moe_experts_decomposition(
        hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, activation: str = "silu"
    ):
        """``fuseops::moe_experts``, every expert on every token, each
        token's routed results weighted and summed."""
        _check_export_activation("fuseops.executorch", activation)
        ct = opmath(hidden.dtype)
        inter = down_proj.shape[2]
        x = hidden.to(ct)
        index = top_k_index.to(torch.int64)
        weights = top_k_weights.to(ct)
        out = torch.zeros_like(x)
        for e in range(gate_up_proj.shape[0]):
            routed = index == e
            weight = torch.where(routed, weights, torch.zeros_like(weights)).sum(1, keepdim=True)
            hit = routed.any(1, keepdim=True)
            gate_up = x @ gate_up_proj[e].to(ct).t()
            gate, up = gate_up[:, :inter], gate_up[:, inter:]
            if activation == "silu":
                act = silu_math(gate)
            else:
                approximate = "tanh" if activation == "gelu_tanh" else "none"
                act = gelu_math(gate, approximate, "moe_experts")
            result = (act * up) @ down_proj[e].to(ct).t()
            out = out + torch.where(hit, result * weight, torch.zeros_like(result))
        return out.to(hidden.dtype)

    return {torch.ops.fuseops.moe_experts.default: moe_experts_decomposition}


#: Results that depend on the thread count (python/README.md, "Threads and
#: determinism"): each expert's products, forward and backward, are ATen's
#: matrix products (at::mm on the expert's rows), whose bits are MKL's.
THREAD_COUNT_DEPENDENT = ("moe_experts",)

__all__ = ["moe_experts", "moe_experts_backward", "moe_experts_forward"]
