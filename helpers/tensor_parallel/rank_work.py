"""What each rank of the tensor-parallel FFN does, whoever launched it.

Timing ``g(shard(f(x)))`` with the all-reduce apart (``timed_forward``), proving the
output against the native FFN (``native_diff``), one SGD step through f and g proven
against the one-process step (``train_step_check``), the rank's memory ledger
(``rank_memory``) and the forward timed at a second, wider size (``wide_timing``), where
each rank's share of the matrix products outweighs the all-reduce. Every collective runs
in the rank's group (``Rank.group``): the whole world, or the first p ranks of a larger
launch (``helpers.torchrun.ranks.first_ranks``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from helpers.core.checks import Proof
from helpers.core.timing import Timing, synchronized_clock
from helpers.memory.ledger import Ledger
from helpers.memory.measure import measure_training_memory
from helpers.profiles import FFNSizes
from helpers.tensor_parallel.block import cut, shard_vs_full
from helpers.tensor_parallel.ffn import FeedForward, make_input
from helpers.tensor_parallel.mappings import f, g, tp_forward
from helpers.tensor_parallel.proofs import output_tolerance
from helpers.tensor_parallel.shards import load_shard
from helpers.torchrun.ranks import Rank, max_over_ranks


class TPFFNConfig(Protocol):
    """What a rank needs to know of its launch: the source's sizes, model, input, shards."""

    hidden_size: int
    seq_len: int
    batch_size: int
    seed: int
    iters: int
    warmup: int

    def model(self, activation: str = "none") -> FeedForward: ...
    def input_batch(self, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor: ...
    def folder(self, world_size: int) -> Path: ...


def timed_forward(shard: nn.Module, x: torch.Tensor, iters: int, warmup: int, group=None):
    """``g(shard(f(x)))`` ``iters`` times in ``group``; the clock is read before, between, after."""
    compute, reduce, total = [], [], []
    with torch.no_grad():
        for i in range(iters):
            dist.barrier(group=group)
            t0 = synchronized_clock()
            partial = shard(f(x, group))  # this rank's partial output: no communication
            t1 = synchronized_clock()
            out = g(partial, group)  # the sum over the group's ranks
            t2 = synchronized_clock()
            if i >= warmup:
                compute.append(t1 - t0)
                reduce.append(t2 - t1)
                total.append(t2 - t0)
    return out, Timing("compute", compute), Timing("all-reduce", reduce), Timing("step", total)


def native_diff(config: TPFFNConfig, rank: Rank, out: torch.Tensor) -> tuple[float, float]:
    """(max |out - native| over all ranks and elements, tolerance); native recomputed here."""
    dtype = out.dtype
    native = config.model().to(rank.device, dtype).eval()
    with torch.no_grad():
        reference = native(config.input_batch(dtype, rank.device))
    diff = (out.double() - reference.double()).abs().max().item()
    return max_over_ranks(diff, rank), output_tolerance(reference, dtype, rank.world_size)


def train_step_check(config: TPFFNConfig, rank: Rank, activation: str, lr: float
                     ) -> tuple[float, tuple[Proof, ...]]:
    """One float32 SGD step through f and g vs the same step of the full model in one process:
    (the loss, the proofs)."""
    folder = config.folder(rank.world_size)
    shard = load_shard(folder, rank.world_size, rank.rank, activation=activation).to(rank.device)
    full = config.model(activation).to(rank.device)
    target = torch.randn(
        config.batch_size, config.seq_len, config.hidden_size,
        generator=torch.Generator().manual_seed(config.seed + 1),
    ).to(rank.device)  # fmt: skip
    results = {}
    for name, model, forward in (
        ("tp", shard, lambda m, x: tp_forward(m, x, rank.group)),
        ("full", full, lambda m, x: m(x)),
    ):
        x = config.input_batch(torch.float32, rank.device).requires_grad_()
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        out = forward(model, x)
        loss = nn.functional.mse_loss(out, target)
        loss.backward()  # through g (identity) and f (all-reduce of the input gradient)
        optimizer.step()
        results[name] = (loss.detach(), out.detach(), x.grad)
    (loss, out, x_grad), (loss_ref, out_ref, x_grad_ref) = results["tp"], results["full"]
    p, r = rank.world_size, rank.rank
    full_grads = torch.cat([w.grad.flatten() for w in full.parameters()])
    full_weights = torch.cat([w.detach().flatten() for w in full.parameters()])
    measured = (  # (what, this rank's max |diff|, the tensor whose size sets the tolerance)
        ("loss", abs(loss.item() - loss_ref.item()), loss_ref),
        ("output", (out - out_ref).abs().max().item(), out_ref),
        ("input_grad", (x_grad - x_grad_ref).abs().max().item(), x_grad_ref),
        ("grads", shard_vs_full(shard, full, p, r, grads=True), full_grads),
        ("weights", shard_vs_full(shard, full, p, r), full_weights),
    )  # fmt: skip
    proofs = tuple(
        Proof(what, max_over_ranks(diff, rank), output_tolerance(ref, torch.float32, p))
        for what, diff, ref in measured
    )
    return loss.item(), proofs


class TensorParallelFFN(nn.Module):
    """A rank's whole forward, ``g(shard(f(x)))``, as one module (to measure its memory)."""

    def __init__(self, shard: nn.Module, group=None) -> None:
        super().__init__()
        self.shard, self.group = shard, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tp_forward(self.shard, x, self.group)


def rank_memory(config: TPFFNConfig, rank: Rank, shard: nn.Module) -> Ledger:
    """This rank's ledger for one float32 SGD step of ``g(shard(f(x)))`` with an MSE loss.

    ``helpers.memory.measure_training_memory`` on the rank's own process: what this rank
    holds, measured where it is held (weights and grads of its shard; activations it keeps).
    """
    model = TensorParallelFFN(copy.deepcopy(shard).float(), rank.group)
    x = config.input_batch(torch.float32, rank.device)
    target = torch.zeros_like(x)  # the values do not change the bytes
    return measure_training_memory(model, x, target)


def wide_timing(sizes: FFNSizes, rank: Rank, dtype: torch.dtype, seed: int
                ) -> tuple[Proof, Timing, Timing, Timing]:
    """The FFN at ``sizes``, cut in memory on every rank, timed like the lesson's and proven:
    (the output's proof, compute, all-reduce and step timings).

    Rank 0 also computes the whole FFN in one piece and compares: every rank holds the same
    output after g's all-reduce.
    """
    torch.manual_seed(seed)
    full = FeedForward(sizes.hidden_size, sizes.ffn_size).to(rank.device, dtype).eval()
    shard = cut(full, rank.world_size, rank.rank)
    x = make_input(sizes.batch_size, sizes.seq_len, sizes.hidden_size, dtype=dtype,
                   device=rank.device, seed=seed)  # fmt: skip
    out, compute, reduce, total = timed_forward(shard, x, sizes.iters, sizes.warmup, rank.group)
    diff = tol = 0.0
    if rank.rank == 0:
        with torch.no_grad():
            reference = full(x)
        diff = (out.double() - reference.double()).abs().max().item()
        tol = output_tolerance(reference, dtype, rank.world_size)
    return Proof("output", diff, tol), compute, reduce, total
