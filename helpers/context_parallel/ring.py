"""Ring attention: keys and values travel round the ranks; queries stay.

Each of ``cp`` ranks holds a slice of the sequence: its queries, keys and values. In
``cp`` steps, every rank attends its queries to the key/value block it holds, merges the
partial result by its log-sum-exp (``merge.merge``), and passes the block to the next
rank while it receives the previous rank's. The backward pass does the same walk: the
key/value gradients travel with their block and arrive home after ``cp`` passes. Under a
causal mask a rank skips every piece of a block that no query of its can see; which
pieces those are follows from the tokens' true positions (``split.positions``), so the
same code serves the contiguous and the zig-zag split (Liu et al. 2023, "Ring Attention
with Blockwise Transformers").
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from helpers.context_parallel.merge import block_attention, causal_mask, merge
from helpers.context_parallel.split import positions

Piece = tuple[slice, slice, torch.Tensor | None]  # query rows, key rows, mask (None: all seen)
_CLOCK = threading.local()  # per rank (a rank may be a thread): the compute_clock in use


@contextmanager
def compute_clock() -> Iterator[list[float]]:
    """Seconds this rank's ring attention spends computing inside the ``with``, apart from
    the time it waits for the next block: ``[seconds]``, filled as it runs."""
    spent = [0.0]
    _CLOCK.spent = spent
    try:
        yield spent
    finally:
        _CLOCK.spent = None


def _charge(start: float) -> None:
    spent = getattr(_CLOCK, "spent", None)
    if spent is not None:
        spent[0] += time.perf_counter() - start


def pieces(q_pos: torch.Tensor, k_pos: torch.Tensor, size: int, causal: bool) -> list[Piece]:
    """The (query chunk, key chunk) pieces to compute, skipping those no query can see."""
    found = []
    for qs in range(0, len(q_pos), size):
        q = q_pos[qs:qs + size]
        for ks in range(0, len(k_pos), size):
            k = k_pos[ks:ks + size]
            if causal and k.min() > q.max():
                continue
            mask = causal_mask(q, k) if causal and k.max() > q.min() else None
            found.append((slice(qs, qs + size), slice(ks, ks + size), mask))
    return found


@dataclass(frozen=True)
class RingPlan:
    """What every rank knows before a step: the ranks, the split, the sequence."""

    rank: int
    cp: int
    seq: int
    split: str
    causal: bool

    @property
    def chunk(self) -> int:
        return self.seq // (self.cp if self.split == "contiguous" else 2 * self.cp)

    def owner(self, step: int) -> int:
        """Whose key/value block this rank holds at ``step`` (0: its own)."""
        return (self.rank - step) % self.cp

    def pieces(self, step: int) -> list[Piece]:
        mine = positions(self.rank, self.cp, self.seq, self.split)
        theirs = positions(self.owner(step), self.cp, self.seq, self.split)
        return pieces(mine, theirs, self.chunk, self.causal)


def ring_pass(tensors: list[torch.Tensor], group: dist.ProcessGroup,
              tag: int = 0) -> list[torch.Tensor]:
    """Send each tensor to the next rank, receive the previous rank's (same shapes)."""
    rank, size = group.rank(), group.size()
    received = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    works = []
    for i, (out, into) in enumerate(zip(tensors, received, strict=True)):
        works.append(group.send([out.contiguous()], (rank + 1) % size, tag + i))
        works.append(group.recv([into], (rank - 1) % size, tag + i))
    for work in works:
        work.wait()
    return received


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Key/value heads repeated to the query heads (grouped-query attention)."""
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def _fold(dx: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Gradients of repeated heads summed back onto their key/value head."""
    b, h, s, d = dx.shape
    return dx.view(b, kv_heads, h // kv_heads, s, d).sum(2)


class RingAttention(torch.autograd.Function):
    """Forward and backward of ring attention over the ranks of ``group``."""

    @staticmethod
    def forward(ctx, q, k, v, group, split, causal):  # noqa: D102 (the class says it)
        plan = RingPlan(group.rank(), group.size(), q.shape[-2] * group.size(), split, causal)
        heads = q.shape[1]
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
        block = [k, v]
        for step in range(plan.cp):
            if step < plan.cp - 1:
                send = block
            start = time.perf_counter()
            for qs, ks, mask in plan.pieces(step):
                part = block_attention(q[..., qs, :], _heads(block[0], heads)[..., ks, :],
                                       _heads(block[1], heads)[..., ks, :], mask)
                out[..., qs, :], lse[..., qs] = merge(out[..., qs, :], lse[..., qs], *part)
            _charge(start)
            if step < plan.cp - 1:
                block = ring_pass(send, group, tag=10 * step)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan, ctx.group = plan, group
        return out

    @staticmethod
    def backward(ctx, dout):  # noqa: D102
        q, k, v, out, lse = ctx.saved_tensors
        plan, group = ctx.plan, ctx.group
        heads, scale = q.shape[1], 1 / math.sqrt(q.shape[-1])
        delta = (dout * out).sum(-1)
        dq = torch.zeros_like(q)
        block = [k, v, torch.zeros_like(k), torch.zeros_like(v)]
        for step in range(plan.cp):
            start = time.perf_counter()
            kk, vv = _heads(block[0], heads), _heads(block[1], heads)
            dk, dv = torch.zeros_like(kk), torch.zeros_like(vv)
            for qs, ks, mask in plan.pieces(step):
                scores = (q[..., qs, :] @ kk[..., ks, :].transpose(-2, -1)) * scale
                p = torch.exp(scores - lse[..., qs, None])
                if mask is not None:
                    p = p.masked_fill(~mask, 0.0)
                dv[..., ks, :] += p.transpose(-2, -1) @ dout[..., qs, :]
                ds = p * (dout[..., qs, :] @ vv[..., ks, :].transpose(-2, -1)
                          - delta[..., qs, None])
                dq[..., qs, :] += (ds @ kk[..., ks, :]) * scale
                dk[..., ks, :] += (ds.transpose(-2, -1) @ q[..., qs, :]) * scale
            block[2] = block[2] + _fold(dk, k.shape[1])
            block[3] = block[3] + _fold(dv, v.shape[1])
            _charge(start)
            if plan.cp > 1:
                moving = block if step < plan.cp - 1 else block[2:]
                moved = ring_pass(moving, group, tag=1000 + 10 * step)
                block = moved if step < plan.cp - 1 else block[:2] + moved
        return dq, block[2], block[3], None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   group: dist.ProcessGroup, split: str = "contiguous",
                   causal: bool = True) -> torch.Tensor:
    """Attention of this rank's queries over the whole sequence's keys and values.

    ``q`` (b, h, s/cp, d), ``k`` and ``v`` (b, kv_heads, s/cp, d): this rank's tokens under
    ``split`` ("contiguous" or "zigzag"); returns this rank's output rows.
    """
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} "
                         "key/value heads")
    return RingAttention.apply(q, k, v, group, split, causal)
