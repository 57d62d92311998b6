"""What tensor parallelism needs of a block, whatever the block computes.

A block that can be split the Megatron-LM way says four things (``ParallelBlock``): which
of its weights are cut and along which dimension (``splits``), how to build rank ``r``'s
shard with the same parameter names (``shard``), the same split as a
``parallelize_module`` plan (``plan``), and the sizes its shard files record (``sizes``).
The shard files, the torchrun workers' proofs and the weights' slices are written once
against these four: the FFN implements them, and attention heads, a gated MLP or a
vocab-parallel embedding would implement the same four without copying the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import nn


@dataclass(frozen=True)
class Split:
    """One weight cut over the ranks: its parameter name and the dimension it is cut along.

    ``dim`` 0 cuts output features (column-parallel), 1 input features (row-parallel).
    """

    tensor: str
    dim: int

    def file(self, rank: int) -> str:
        """Rank ``rank``'s file: the source's ``fc1_{rank}.bin`` for ``fc1.weight``."""
        return f"{self.tensor.rsplit('.', 1)[0]}_{rank}.bin"


@runtime_checkable
class ParallelBlock(Protocol):
    """A full block that tensor parallelism can split (see the module's docstring)."""

    def splits(self) -> tuple[Split, ...]: ...

    def shard(self, world_size: int, rank: int) -> nn.Module: ...

    def plan(self) -> dict: ...

    def sizes(self) -> dict[str, int]: ...


def chunks(block: ParallelBlock, world_size: int) -> list[dict[str, torch.Tensor]]:
    """Per rank, each split weight's chunk: ``torch.split`` into ``world_size`` equal parts."""
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(world_size)]
    for s in block.splits():
        weight = block.get_parameter(s.tensor).detach()
        size = weight.shape[s.dim]
        if size % world_size:
            raise ValueError(
                f"{s.tensor} has {size} along dim {s.dim}, not divisible by "
                f"world_size={world_size}; valid: a world size that divides {size}"
            )
        for rank, part in enumerate(torch.split(weight, size // world_size, dim=s.dim)):
            out[rank][s.tensor] = part
    return out


def load_chunks(shard: nn.Module, parts: dict[str, torch.Tensor]) -> nn.Module:
    """Copy each chunk into the shard's parameter of that name, shapes checked; the shard."""
    for name, part in parts.items():
        param = shard.get_parameter(name)
        if tuple(part.shape) != tuple(param.shape):
            raise ValueError(
                f"{name}: a chunk of shape {tuple(part.shape)} for a parameter of shape "
                f"{tuple(param.shape)}"
            )
        with torch.no_grad():
            param.copy_(part)
    return shard


def cut(block: ParallelBlock, world_size: int, rank: int) -> nn.Module:
    """Rank ``rank``'s shard cut from the full block, on its device and in its dtype."""
    weight = next(block.parameters())
    shard = block.shard(world_size, rank)
    return load_chunks(shard, chunks(block, world_size)[rank]).to(weight.device, weight.dtype)


def full_slice(tensor: torch.Tensor, split: Split, world_size: int, rank: int) -> torch.Tensor:
    """The part of a full weight (or its gradient) that rank ``rank`` holds."""
    per_rank = tensor.shape[split.dim] // world_size
    return tensor.narrow(split.dim, rank * per_rank, per_rank)


def shard_vs_full(
    shard: nn.Module, full: ParallelBlock, world_size: int, rank: int, *, grads: bool = False
) -> float:
    """Largest |difference| between a shard's split weights (or gradients) and the full
    block's matching slices, in float64."""
    worst = 0.0
    for s in full.splits():
        mine, whole = shard.get_parameter(s.tensor), full.get_parameter(s.tensor)
        if grads:
            mine, whole = mine.grad, whole.grad
        if hasattr(mine, "to_local"):  # a DTensor (parallelize_module's): this rank's part
            mine = mine.to_local()
        theirs = full_slice(whole.detach(), s, world_size, rank)
        if mine.shape != theirs.shape:
            raise ValueError(
                f"{s.tensor}: the shard's {tuple(mine.shape)} does not match the full block's "
                f"slice {tuple(theirs.shape)}"
            )
        diff = (mine.detach().double().cpu() - theirs.double().cpu()).abs().max().item()
        worst = max(worst, diff)
    return worst
