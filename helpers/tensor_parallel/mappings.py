"""Megatron-LM's communication operators f and g, and what they cost.

``f`` sits before ``fc1``: identity forward, all-reduce (sum) of the input gradient
backward. ``g`` sits after ``fc2``: all-reduce (sum) of the partial outputs forward,
identity backward. A rank computes ``g(shard(f(x)))``; these are the only places where
ranks talk. Both need a ``torch.distributed`` process group (``torchrun``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from helpers.comm.collectives import ring_bytes
from helpers.core.sizes import format_bytes
from helpers.tensor_parallel.ffn import validate_split


class _CopyToTensorParallel(torch.autograd.Function):
    """f: identity forward; all-reduce (sum) of the input gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group=None) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """g: all-reduce (sum) of the partial outputs forward; identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group=None) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def f(x: torch.Tensor, group=None) -> torch.Tensor:
    """Megatron's f, before fc1: forward identity, backward all-reduce."""
    return _CopyToTensorParallel.apply(x, group)


def g(x: torch.Tensor, group=None) -> torch.Tensor:
    """Megatron's g, after fc2: forward all-reduce, backward identity."""
    return _ReduceFromTensorParallel.apply(x, group)


def tp_forward(shard: nn.Module, x: torch.Tensor, group=None) -> torch.Tensor:
    """One rank's tensor-parallel FFN in a process group: ``g(shard(f(x)))``."""
    return g(shard(f(x, group)), group)


def ring_allreduce_bytes(tensor_bytes: float, world_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce: reduce-scatter + all-gather, 2(p-1)/p
    (lesson 06's ``ring_bytes``)."""
    return ring_bytes("all_reduce", world_size, tensor_bytes)


@dataclass(frozen=True)
class TpCost:
    """Per-rank work and traffic of one forward of the tensor-parallel FFN."""

    world_size: int
    flops: float  # multiply-adds count 2 FLOPs
    weight_bytes: int
    allreduce_bytes: float  # what each rank sends in a ring all-reduce of the output (NCCL's)

    @property
    def flops_per_byte(self) -> float | None:
        """FLOPs a rank computes per byte it sends (None without communication)."""
        return self.flops / self.allreduce_bytes if self.allreduce_bytes else None


def tp_cost(
    batch_size: int,
    seq_len: int,
    hidden_size: int,
    ffn_size: int,
    world_size: int,
    dtype_bytes: int,
) -> TpCost:
    """FLOPs, weight bytes and all-reduce bytes per rank for ``world_size`` ranks."""
    per_rank = validate_split(ffn_size, world_size)
    tokens = batch_size * seq_len
    flops = 2 * tokens * hidden_size * per_rank * 2  # fc1 and fc2, each 2*m*n*k
    output_bytes = tokens * hidden_size * dtype_bytes
    return TpCost(
        world_size,
        flops,
        2 * hidden_size * per_rank * dtype_bytes,
        ring_allreduce_bytes(output_bytes, world_size),
    )


def format_costs(costs: Sequence[TpCost]) -> str:
    """A table of ``tp_cost`` rows."""
    lines = [
        f"{'ranks':>5} {'GFLOP/rank':>11} {'weights/rank':>13} {'ring all-reduce/rank':>21} "
        f"{'FLOPs per byte sent':>20}"
    ]
    for c in costs:
        ratio = f"{c.flops_per_byte:,.0f}" if c.flops_per_byte else "no communication"
        lines.append(
            f"{c.world_size:>5} {c.flops / 1e9:>11.3f} {format_bytes(c.weight_bytes):>13} "
            f"{format_bytes(c.allreduce_bytes):>21} {ratio:>20}"
        )
    return "\n".join(lines)


def allreduce_seconds(
    tensor_bytes: float, world_size: int, *, bandwidth: float, latency: float
) -> float:
    """A ring all-reduce's time: 2(p-1) steps, each a fixed ``latency`` plus its bytes / bandwidth."""
    steps = 2 * (world_size - 1)
    return steps * latency + ring_allreduce_bytes(tensor_bytes, world_size) / bandwidth


def forward_seconds(
    cost: TpCost, output_bytes: float, *, flop_rate: float, bandwidth: float, latency: float
) -> tuple[float, float]:
    """(compute, all-reduce) seconds of one forward. g is on the critical path: they add up."""
    return cost.flops / flop_rate, allreduce_seconds(
        output_bytes, cost.world_size, bandwidth=bandwidth, latency=latency
    )
