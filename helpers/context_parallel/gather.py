"""All-gathered keys and values (Llama 3's context parallelism), and Ulysses.

*All-gather*: every rank gathers the whole sequence's keys and values, then attends its own
queries to them; the backward pass reduce-scatters the key/value gradients home. Simple,
and what Llama 3 used (Llama 3 paper, section 3.3.2): with grouped-query attention the keys
and values are small next to the queries.

*Ulysses* (Jacobs et al. 2023): an all-to-all turns sequence-split tensors
(b, h, s/cp, d) into head-split ones (b, h/cp, s, d); each rank attends whole sequences for
its heads, and a second all-to-all turns the output back. The heads, and the key/value
heads, must be divisible by cp.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.comm.collectives import all_gather, reduce_scatter
from helpers.context_parallel.merge import causal_mask
from helpers.context_parallel.split import positions


def _true_order(group: dist.ProcessGroup, local: int, split: str) -> torch.Tensor:
    """Positions of the tokens gathered rank after rank."""
    cp = group.size()
    return torch.cat([positions(r, cp, local * cp, split) for r in range(cp)])


class _GatherSeq(torch.autograd.Function):
    """All-gather along the sequence; backward: reduce-scatter of the gradient."""

    @staticmethod
    def forward(ctx, x, group):  # noqa: D102
        ctx.group = group
        cp = group.size()
        gathered = torch.empty((cp, *x.shape), dtype=x.dtype, device=x.device)
        all_gather(gathered, x.contiguous()[None], group=group)  # rank after rank, dim 0
        return torch.cat(gathered.unbind(0), dim=-2)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        cp = ctx.group.size()
        stacked = torch.stack(grad.chunk(cp, dim=-2))  # block j: the keys rank j holds
        out = torch.empty(stacked.shape[1:], dtype=grad.dtype, device=grad.device)
        reduce_scatter(out[None], stacked, group=ctx.group)
        return out, None


def allgather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        group: dist.ProcessGroup, split: str = "contiguous",
                        causal: bool = True) -> torch.Tensor:
    """This rank's queries over the all-gathered keys and values (shapes as in ring)."""
    local = q.shape[-2]
    keys, values = _GatherSeq.apply(k, group), _GatherSeq.apply(v, group)
    mine = positions(group.rank(), group.size(), local * group.size(), split)
    mask = causal_mask(mine, _true_order(group, local, split)) if causal else None
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                          enable_gqa=q.shape[1] != k.shape[1])


def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Block ``j`` of dim 0 goes to rank ``j``; block ``j`` of the result came from it."""
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


class _SeqToHeads(torch.autograd.Function):
    """(b, h, s/cp, d) sequence-split -> (b, h/cp, s, d) head-split, rank-major tokens."""

    @staticmethod
    def forward(ctx, x, group):  # noqa: D102
        ctx.group = group
        return seq_to_heads(x, group)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        return heads_to_seq(grad, ctx.group), None


class _HeadsToSeq(torch.autograd.Function):
    """The inverse of ``_SeqToHeads``."""

    @staticmethod
    def forward(ctx, x, group):  # noqa: D102
        ctx.group = group
        return heads_to_seq(x, group)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        return seq_to_heads(grad, ctx.group), None


def seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """One all-to-all: my tokens of every head -> every rank's tokens of my heads."""
    cp = group.size()
    b, h, s, d = x.shape
    if h % cp:
        raise ValueError(f"Ulysses needs heads divisible by cp: {h} heads, cp={cp}")
    blocks = x.reshape(b, cp, h // cp, s, d).transpose(0, 1)  # (cp, b, h/cp, s, d)
    got = _all_to_all(blocks, group)  # got[j]: rank j's tokens of my heads
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // cp, cp * s, d)


def heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """One all-to-all back: every rank's tokens of my heads -> my tokens of every head."""
    cp = group.size()
    b, hl, s_all, d = x.shape
    blocks = x.reshape(b, hl, cp, s_all // cp, d).permute(2, 0, 1, 3, 4)  # (cp, b, h/cp, s, d)
    got = _all_to_all(blocks, group)  # got[j]: my tokens of rank j's heads
    return got.transpose(0, 1).reshape(b, cp * hl, s_all // cp, d)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      group: dist.ProcessGroup, split: str = "contiguous",
                      causal: bool = True) -> torch.Tensor:
    """Ulysses: head-split attention over whole sequences, between two all-to-alls."""
    cp = group.size()
    if q.shape[1] % cp or k.shape[1] % cp:
        raise ValueError(f"Ulysses needs the heads ({q.shape[1]}) and key/value heads "
                         f"({k.shape[1]}) divisible by cp={cp}")
    qh, kh, vh = (_SeqToHeads.apply(t, group) for t in (q, k, v))
    order = _true_order(group, q.shape[-2], split)
    mask = causal_mask(order, order) if causal else None
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask,
                                         enable_gqa=qh.shape[1] != kh.shape[1])
    return _HeadsToSeq.apply(out, group)
