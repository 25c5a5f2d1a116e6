"""fuseops modules under data parallelism: a small model built from
fuseops.nn modules, trained for a few optimizer steps by 2 local processes
(gloo on CPU, loopback) under DDP and under FSDP2 (fully_shard), ends with
the parameters that one process training on the same global batch gets.

Nothing in fuseops is distributed-aware: its modules are ordinary
nn.Modules whose parameters DDP and FSDP see and whose gradients come from
the ops' autograd, so this checks that the ops' backward composes with the
gradient all-reduce / reduce-scatter and with FSDP's sharded parameters
(FSDP2 hands the modules parameters that are all-gathered views)."""

from __future__ import annotations

import faulthandler
import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fuseops.nn as fnn

WORLD_SIZE = 2
STEPS = 3
BATCH, SEQ, DIM, HEADS = 4, 8, 32, 4  # global batch, split evenly over the ranks
LR = 0.05


class Block(torch.nn.Module):
    """A pre-norm transformer-like block using every trainable fuseops
    module kind: RMSNorm, rotary attention mixing, CausalConv1d, LayerNorm,
    SwiGLU and GeGLU."""

    def __init__(self) -> None:
        super().__init__()
        self.attn_norm = fnn.RMSNorm(DIM)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM, bias=False)
        self.rope = fnn.RotaryEmbedding(DIM // HEADS, max_position_embeddings=SEQ)
        self.conv = fnn.CausalConv1d(DIM, width=4, activation="silu")
        self.mlp_norm = fnn.LayerNorm(DIM)
        self.mlp = fnn.SwiGLU(DIM, 2 * DIM)
        self.mlp2 = fnn.GeGLU(DIM, DIM, approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(batch, seq, 3, HEADS, DIM // HEADS).unbind(2)
        positions = torch.arange(seq).expand(batch, seq)
        q, k = self.rope(q, k, positions)
        attn = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + attn.transpose(1, 2).reshape(batch, seq, DIM)
        x = x + self.conv(x.transpose(1, 2)).transpose(1, 2)
        h = self.mlp_norm(x)
        return x + self.mlp(h) + self.mlp2(h)


def make_model() -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(Block(), Block())


def make_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(99)
    return [
        (
            torch.randn(BATCH, SEQ, DIM, generator=generator),
            torch.randn(BATCH, SEQ, DIM, generator=generator),
        )
        for _ in range(STEPS)
    ]


def train(model: torch.nn.Module, batches, rank: int = 0, world_size: int = 1) -> None:
    """SGD with momentum on mean-squared error: each rank takes its
    contiguous share of the global batch; the mean over the local share,
    averaged over ranks by DDP/FSDP, is the mean over the global batch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    share = BATCH // world_size
    for x, target in batches:
        local = slice(rank * share, (rank + 1) * share)
        loss = torch.nn.functional.mse_loss(model(x[local]), target[local])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters by name, FSDP2's DTensor shards gathered into full tensors."""
    return {
        name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        for name, p in model.named_parameters()
    }


def _worker(rank: int, port: int, mode: str, result_dir: str) -> None:
    # A worker that aborts prints its Python stack into the test's output.
    faulthandler.enable()
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD_SIZE)
    try:
        torch.set_num_threads(1)
        model = make_model()
        if mode == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
        else:
            from torch.distributed.fsdp import fully_shard

            for block in model:
                fully_shard(block)
            fully_shard(model)
        train(model, make_batches(), rank, WORLD_SIZE)
        state = full_state(model.module if mode == "ddp" else model)
        if rank == 0:
            torch.save(state, os.path.join(result_dir, f"{mode}.pt"))
        # Neither rank tears gloo down while the other may still be in a
        # collective (FSDP2's last reduce-scatter, the full_tensor gathers):
        # that aborts the process ("terminate called without an active
        # exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def single_process_state() -> dict[str, torch.Tensor]:
    model = make_model()
    train(model, make_batches())
    return full_state(model)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_data_parallel_training_matches_single_process(mode, single_process_state, tmp_path):
    # The rendezvous store is this process's, on a loopback port the system
    # picks (port 0) and holds: no window in which another program could
    # take a port chosen free.
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    mp.spawn(_worker, args=(store.port, mode, str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    state = torch.load(tmp_path / f"{mode}.pt")
    assert state.keys() == single_process_state.keys()
    initial = full_state(make_model())
    for name, expected in single_process_state.items():
        # Training must have moved every parameter, or the comparison would
        # not see a missing gradient.
        assert not torch.equal(expected, initial[name]), name
        # float32 throughout; the runs differ only in how the gradient sum is
        # split and ordered (two half-batch sums added by the all-reduce vs
        # one full-batch sum): a few ulps per step, 3e-7 of the largest
        # parameter measured after 3 steps, against steps of 1e-3 and more.
        torch.testing.assert_close(state[name], expected, rtol=1e-5, atol=1e-6, msg=name)
