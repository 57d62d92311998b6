"""The small Llama with context parallelism: every rank runs the whole model on its tokens.

Only attention mixes tokens; the embedding, the norms, the MLP and the head act on each
token alone, so they run unchanged on this rank's slice of the sequence. Attention is
swapped for :class:`CPAttention`: the same projections, rotary positions taken at each
token's true position, and one of the context-parallel variants in between. Every rank
holds every weight and sees a different part of every sequence, so each weight's gradient
is a partial sum over its tokens: after backward they are summed over the cp group, as
data parallelism sums them over the batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from helpers.context_parallel.gather import allgather_attention, ulysses_attention
from helpers.context_parallel.ring import ring_attention
from helpers.context_parallel.split import positions, shard
from helpers.context_parallel.traffic import validate_variant
from helpers.models.attention import AttentionHeads, rope

ATTENTION = {"ring": ring_attention, "zigzag": ring_attention,
             "allgather": allgather_attention, "ulysses": ulysses_attention}


def split_of(variant: str) -> str:
    """The token split a variant runs on: zig-zag for "zigzag", else contiguous."""
    return "zigzag" if validate_variant(variant) == "zigzag" else "contiguous"


class CPAttention(nn.Module):
    """``heads``' attention (a whole block's, or a tensor-parallel rank's share) on this
    rank's tokens; parameter names unchanged (q_proj, k_proj, v_proj, o_proj)."""

    def __init__(self, heads: AttentionHeads, group: dist.ProcessGroup, variant: str) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            heads.q_proj, heads.k_proj, heads.v_proj, heads.o_proj)
        self.head_dim, self.rope = heads.head_dim, heads.rope
        self.group, self.variant, self.split = group, variant, split_of(variant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, local, _ = x.shape
        cp = self.group.size()

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, local, -1, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        if self.rope:
            at = positions(self.group.rank(), cp, local * cp, self.split)
            q, k = rope(q, positions=at), rope(k, positions=at)
        out = ATTENTION[self.variant](q, k, v, self.group, self.split, True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, local, -1))


def context_parallel(model: nn.Module, group: dist.ProcessGroup, variant: str) -> nn.Module:
    """``model`` (a TinyLM, or a tensor-parallel rank's share) with every block's
    attention context-parallel over ``group``; changed in place and returned."""
    for block in model.blocks:
        if not isinstance(block.attn, AttentionHeads):
            raise TypeError(f"block attention {type(block.attn).__name__}: valid: AttentionHeads")
        block.attn = CPAttention(block.attn, group, variant)
    return model


def local_loss(logits: torch.Tensor, targets: torch.Tensor, total_tokens: int) -> torch.Tensor:
    """This rank's share of the mean cross-entropy: its tokens' sum over all tokens; the
    shares add up over the cp group to the mean over the whole batch."""
    flat = logits.reshape(-1, logits.shape[-1])
    return F.cross_entropy(flat, targets.reshape(-1), reduction="sum") / total_tokens


def sum_gradients(model: nn.Module, group: dist.ProcessGroup) -> int:
    """Sum every weight's gradient over ``group`` (each rank saw other tokens); elements."""
    count = 0
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, group=group)
            count += param.grad.numel()
    return count


def tokens_of(ids: torch.Tensor, group: dist.ProcessGroup, variant: str) -> torch.Tensor:
    """This rank's tokens of ``ids`` (batch, seq)."""
    return shard(ids, group.rank(), group.size(), split_of(variant), dim=1)
