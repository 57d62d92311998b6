"""Attention in pieces: one block of keys at a time, merged by the log-sum-exp.

Softmax attention of a query over keys split into blocks can be computed block by block:
each block gives its partial output (softmax over that block only) and the log of its
denominator, the log-sum-exp ``lse``. Two partial results merge exactly: the merged
denominator is ``exp(lse_a) + exp(lse_b)``, and each partial output is re-weighted by its
share of it. Ring attention is built on this; the merge of the denominators is the online
softmax of Milakov and Gimelshein 2018, "Online normalizer calculation for softmax".
"""

from __future__ import annotations

import math

import torch


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """``[i, j]`` is True where query ``i`` may see key ``j`` (key position <= query's)."""
    return k_pos[None, :] <= q_pos[:, None]


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` (b, h, sq, d) over one block ``k``, ``v`` (b, h, sk, d).

    Returns the block's output (b, h, sq, d) and log-sum-exp (b, h, sq). A query that sees
    no key of the block (all masked) gets output 0 and lse = -inf: it adds nothing on merge.
    """
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    seen = torch.isfinite(lse)
    weights = torch.exp(scores - torch.where(seen, lse, 0.0)[..., None])
    out = weights @ v
    return torch.where(seen[..., None], out, 0.0), lse


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
          lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two partial attention results over disjoint key blocks, merged into one (exact)."""
    lse = torch.logaddexp(lse_a, lse_b)
    seen = torch.isfinite(lse)
    safe = torch.where(seen, lse, 0.0)
    share_a = torch.where(seen, torch.exp(lse_a - safe), 0.0)[..., None]
    share_b = torch.where(seen, torch.exp(lse_b - safe), 0.0)[..., None]
    return share_a * out_a + share_b * out_b, lse


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: int,
                        causal: bool = False) -> torch.Tensor:
    """Attention over ``k``, ``v`` cut into ``blocks`` equal key blocks, merged one by one."""
    seq = k.shape[-2]
    if blocks < 1 or seq % blocks:
        raise ValueError(f"blocks={blocks!r} must divide the key length {seq} (valid: "
                         f"{[n for n in range(1, seq + 1) if seq % n == 0]})")
    q_pos = torch.arange(q.shape[-2])
    size = seq // blocks
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    for start in range(0, seq, size):
        k_pos = torch.arange(start, start + size)
        mask = causal_mask(q_pos, k_pos) if causal else None
        part = block_attention(q, k[..., start:start + size, :], v[..., start:start + size, :],
                               mask)
        out, lse = merge(out, lse, *part)
    return out
