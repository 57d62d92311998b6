"""Sequence parallelism's communication: the operators g and g-bar along the sequence.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", arXiv:2205.05198, section 4.2.2) keep the residual stream between the
tensor-parallel regions sharded along the sequence: each of ``tp`` ranks holds
``seq / tp`` tokens, and runs the norms (and the residual adds) on those only. The
regions still need every token, so the operators around them change. The paper's names
(its figures 4 to 6): tensor parallelism's operators are f (identity forward, all-reduce
backward) and its conjugate f-bar (all-reduce forward, identity backward), Shoeybi et
al.'s f and g, lesson 07's ``mappings.f`` and ``mappings.g``; sequence parallelism
replaces them with

- g (``gather_sequence``), on entry instead of f: all-gather of the tokens forward,
  reduce-scatter of the gradient backward;
- g-bar (``scatter_sequence``), on exit instead of f-bar: reduce-scatter forward (sum the
  ranks' partial outputs, keep this rank's tokens), all-gather of the gradient backward.

So the paper's g is not lesson 07's g: that one is the paper's f-bar. A ring all-reduce
*is* a reduce-scatter followed by an all-gather, so by the ring formula each rank sends
the same bytes as with f and f-bar (the paper's argument); gloo runs a reduce-scatter as
a whole all-reduce, so on gloo it sends more. What changes for memory is that the tensors
between the regions are ``tp`` times smaller. Tensors are ``(batch, seq, hidden)``; the
sequence is dim 1.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from helpers.comm.collectives import all_gather, reduce_scatter

SEQ_DIM = 1


def check_sequence_split(seq: int, tp: int) -> None:
    """Refuse a sequence that does not split evenly over ``tp`` ranks."""
    if seq % tp:
        valid = [p for p in range(1, seq + 1) if seq % p == 0]
        raise ValueError(f"seq={seq} is not divisible by tp={tp} (sequence parallelism gives "
                         f"every rank seq/tp tokens); valid tp for seq={seq}: "
                         f"{', '.join(map(str, valid))}")


def _gather(x: torch.Tensor, group) -> torch.Tensor:
    """All ranks' token slices, in rank order, along the sequence."""
    tp = dist.get_world_size(group)
    front = x.movedim(SEQ_DIM, 0).contiguous()  # the collectives cut dim 0
    out = front.new_empty((tp * front.shape[0], *front.shape[1:]))
    all_gather(out, front, group=group)
    return out.movedim(0, SEQ_DIM).contiguous()  # batch-major again: views would be copied later


def _reduce_scatter(x: torch.Tensor, group) -> torch.Tensor:
    """The sum over ranks of ``x``, this rank's slice of the sequence."""
    tp = dist.get_world_size(group)
    check_sequence_split(x.shape[SEQ_DIM], tp)
    front = x.movedim(SEQ_DIM, 0).contiguous()
    out = front.new_empty((front.shape[0] // tp, *front.shape[1:]))
    reduce_scatter(out, front, group=group)
    return out.movedim(0, SEQ_DIM).contiguous()  # batch-major again: views would be copied later


class _GatherSequence(torch.autograd.Function):
    """The paper's g: all-gather forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group=None) -> torch.Tensor:
        ctx.group = group
        return _gather(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _reduce_scatter(grad, ctx.group), None


class _ScatterSequence(torch.autograd.Function):
    """The paper's g-bar: reduce-scatter forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group=None) -> torch.Tensor:
        ctx.group = group
        return _reduce_scatter(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _gather(grad, ctx.group), None


def gather_sequence(x: torch.Tensor, group=None) -> torch.Tensor:
    """The paper's g, on entry to a tensor-parallel region: every rank gets every token."""
    return _GatherSequence.apply(x, group)


def scatter_sequence(x: torch.Tensor, group=None) -> torch.Tensor:
    """The paper's g-bar, on exit: the ranks' partial outputs summed, each rank keeping its
    tokens."""
    return _ScatterSequence.apply(x, group)


def all_reduce_sequence_grads(params, group=None) -> int:
    """Sum the gradients of weights applied to this rank's tokens only (the norms under
    sequence parallelism), so every rank holds the gradient over all tokens; returns the
    number of elements reduced (one flat all-reduce)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0
    flat = torch.cat([t.reshape(-1) for t in grads])
    dist.all_reduce(flat, group=group)
    offset = 0
    for t in grads:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return flat.numel()
