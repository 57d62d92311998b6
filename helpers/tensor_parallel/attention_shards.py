"""Grouped-query attention with rotary positions, and how its heads are dealt to ranks.

Grouped-query attention (GQA) has ``heads`` query heads but only ``kv_heads`` key and
value heads: query head ``i`` reads key/value head ``i // (heads // kv_heads)``. Keys and
values shrink by ``heads / kv_heads``, and so does the cache a generator keeps of them.

Heads are independent of one another until the output projection mixes them, which is
why attention splits by heads: rank ``r`` of ``tp`` keeps a contiguous run of query
heads and the key/value heads those queries read. Each rank's share is itself a smaller
GQA (:class:`AttentionHeads`) with ``heads / tp`` and ``kv_heads / tp`` heads.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

ROPE_BASE = 10000.0


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(a, b) -> (-b, a)`` over the two halves of the last dimension."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def rope(x: torch.Tensor, base: float = ROPE_BASE) -> torch.Tensor:
    """Rotary position embedding of ``x`` (batch, heads, seq, head_dim), positions 0..seq-1.

    Channel pair ``(j, j + head_dim/2)`` at position ``p`` turns by the angle
    ``p * base ** (-2j / head_dim)``. No weights: every rank applies it to its own heads.
    """
    seq, dim = x.shape[-2], x.shape[-1]
    if dim % 2:
        raise ValueError(f"head_dim={dim} is odd; valid: an even head_dim (channels go in pairs)")
    steps = torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim
    positions = torch.arange(seq, device=x.device, dtype=torch.float32)
    angles = positions[:, None] * base ** -steps[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return x * angles.cos().to(x.dtype) + rotate_half(x) * angles.sin().to(x.dtype)


def _check_positive(**sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}; valid: an integer >= 1")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class AttentionHeads(nn.Module):
    """Causal GQA over ``heads`` query and ``kv_heads`` key/value heads of ``head_dim``.

    q projects ``hidden -> heads * head_dim``, k and v ``hidden -> kv_heads * head_dim``,
    o ``heads * head_dim -> hidden``; no biases. The whole attention of a block, or one
    rank's share of it.
    """

    def __init__(
        self, hidden: int, heads: int, kv_heads: int, head_dim: int, rope: bool = True
    ) -> None:
        super().__init__()
        _check_positive(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
        if heads % kv_heads:
            raise ValueError(
                f"heads={heads} is not a multiple of kv_heads={kv_heads}; valid kv_heads: "
                f"{', '.join(map(str, _divisors(heads)))}"
            )
        if rope and head_dim % 2:
            raise ValueError(f"head_dim={head_dim} is odd; valid with rope=True: an even head_dim")
        self.heads, self.kv_heads, self.head_dim, self.rope = heads, kv_heads, head_dim, rope
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape

        def split(t: torch.Tensor, count: int) -> torch.Tensor:
            return t.view(batch, seq, count, self.head_dim).transpose(1, 2)

        q = split(self.q_proj(x), self.heads)
        k = split(self.k_proj(x), self.kv_heads)
        v = split(self.v_proj(x), self.kv_heads)
        if self.rope:
            q, k = rope(q), rope(k)
        group = self.heads // self.kv_heads
        if group > 1:  # each key/value head serves `group` neighbouring query heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))


class GQAAttention(AttentionHeads):
    """A Llama block's attention: ``heads`` heads of ``hidden / heads`` channels each."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, rope: bool = True) -> None:
        _check_positive(hidden=hidden, heads=heads)
        if hidden % heads:
            raise ValueError(
                f"hidden={hidden} is not divisible by heads={heads}; valid heads: "
                f"{', '.join(map(str, _divisors(hidden)))}"
            )
        super().__init__(hidden, heads, kv_heads, hidden // heads, rope)


def valid_tp(heads: int, kv_heads: int, ffn: int | None = None) -> list[int]:
    """Every tensor-parallel size that splits the heads (and the MLP width) evenly."""
    return _divisors(math.gcd(heads, kv_heads, ffn or 0))


def check_head_split(heads: int, kv_heads: int, tp: int, ffn: int | None = None) -> None:
    """Refuse a ``tp`` that does not divide both ``heads`` and ``kv_heads``.

    Every rank must own whole query heads *and* whole key/value heads, and the queries
    of a rank must read only the key/value heads of that rank; both hold when ``tp``
    divides ``heads`` and ``kv_heads`` (then ``heads / tp`` is a multiple of the group
    size ``heads / kv_heads``). The alternative, used when ``tp > kv_heads``, is to
    *replicate* key/value heads: each is held by the ``tp / kv_heads`` ranks whose
    queries read it. It costs memory and work (those k/v weights, their projections and
    their cache are kept ``tp / kv_heads`` times) and, in training, an extra all-reduce of
    the replicated k/v weights' gradients among the ranks sharing them, since each rank
    sees only its own queries' share. This module refuses instead.
    """
    _check_positive(heads=heads, kv_heads=kv_heads)
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp={tp!r}; valid: an integer >= 1")
    if heads % tp or kv_heads % tp:
        raise ValueError(
            f"tp={tp} must divide heads={heads} and kv_heads={kv_heads} (key/value heads "
            f"are not replicated here); valid tp: "
            f"{', '.join(map(str, valid_tp(heads, kv_heads, ffn)))}"
        )


def head_ranges(heads: int, kv_heads: int, tp: int, rank: int) -> tuple[range, range]:
    """(query heads, key/value heads) that rank ``rank`` of ``tp`` owns."""
    check_head_split(heads, kv_heads, tp)
    if not isinstance(rank, int) or not 0 <= rank < tp:
        raise ValueError(f"rank={rank!r}; valid: 0 .. {tp - 1} for tp={tp}")
    q, kv = heads // tp, kv_heads // tp
    return range(rank * q, (rank + 1) * q), range(rank * kv, (rank + 1) * kv)
