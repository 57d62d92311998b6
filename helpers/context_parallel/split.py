"""Which tokens each rank holds: a contiguous split, or the zig-zag that balances causal work.

Under a causal mask, token ``i`` attends to the ``i + 1`` tokens before it, so the last
chunk of a sequence costs the most. Cut in ``cp`` contiguous chunks, rank ``r`` computes
``r + 1`` of the ``cp`` key blocks. The zig-zag split cuts the sequence in ``2 cp`` chunks
and gives rank ``r`` chunks ``r`` and ``2 cp - 1 - r``: one cheap, one dear, the same total.
"""

from __future__ import annotations

import torch

VARIANTS = ("contiguous", "zigzag")


def chunks_of(rank: int, cp: int, split: str) -> list[int]:
    """The chunk indices rank ``rank`` holds (chunks of seq/cp, or of seq/(2 cp) for zig-zag)."""
    if split not in VARIANTS:
        raise ValueError(f"split={split!r}; valid: {', '.join(VARIANTS)}")
    if cp < 1 or not 0 <= rank < cp:
        raise ValueError(f"rank={rank!r} with cp={cp!r}; valid: cp >= 1 and 0 <= rank < cp")
    return [rank] if split == "contiguous" else [rank, 2 * cp - 1 - rank]


def positions(rank: int, cp: int, seq: int, split: str) -> torch.Tensor:
    """The true positions (token indices in the whole sequence) of rank ``rank``'s tokens."""
    parts = cp if split == "contiguous" else 2 * cp
    if seq % parts:
        raise ValueError(f"seq={seq!r} is not divisible into {parts} chunks for split "
                         f"{split!r} with cp={cp}; use a multiple of {parts}")
    size = seq // parts
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunks_of(rank, cp, split)])


def shard(x: torch.Tensor, rank: int, cp: int, split: str, dim: int = -2) -> torch.Tensor:
    """Rank ``rank``'s tokens of ``x`` along ``dim`` (the sequence dimension)."""
    return x.index_select(dim, positions(rank, cp, x.shape[dim], split))


def unshard(parts: list[torch.Tensor], cp: int, split: str, dim: int = -2) -> torch.Tensor:
    """The whole sequence back from every rank's tokens, in true order."""
    seq = sum(p.shape[dim] for p in parts)
    order = torch.cat([positions(r, cp, seq, split) for r in range(cp)])
    return torch.cat(parts, dim=dim).index_select(dim, torch.argsort(order))


def causal_work(rank: int, cp: int, seq: int, split: str) -> int:
    """Score entries (query, key) pairs rank ``rank`` computes under a causal mask when it
    skips only key blocks no query of a block can see, in units of whole chunk pairs."""
    mine = positions(rank, cp, seq, split)
    parts = cp if split == "contiguous" else 2 * cp
    size = seq // parts
    total = 0
    for owner in range(cp):
        keys = positions(owner, cp, seq, split)
        for q in mine.split(size):
            for k in keys.split(size):
                if k.min() <= q.max():
                    total += q.numel() * k.numel()
    return total
