"""How grouped-query attention's heads are dealt to tensor-parallel ranks.

Heads are independent of one another until the output projection mixes them, which is
why attention splits by heads: rank ``r`` of ``tp`` keeps a contiguous run of query
heads and the key/value heads those queries read. Each rank's share is itself a smaller
GQA (:class:`~helpers.models.attention.AttentionHeads`) with ``heads / tp`` and
``kv_heads / tp`` heads.
"""

from __future__ import annotations

import math

from helpers.models.attention import check_positive, divisors


def valid_tp(heads: int, kv_heads: int, ffn: int | None = None) -> list[int]:
    """Every tensor-parallel size that splits the heads (and the MLP width) evenly."""
    return divisors(math.gcd(heads, kv_heads, ffn or 0))


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
    check_positive(heads=heads, kv_heads=kv_heads)
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
