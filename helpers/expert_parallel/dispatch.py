"""Expert parallelism by hand: the experts split across ranks, the tokens sent to them.

With ``ep`` ranks, rank ``r`` holds experts ``[r E/ep, (r+1) E/ep)``, and its own tokens.
Every rank holds the whole router (and the shared expert). One step of the layer:

1. route: the router picks each token's ``k`` experts (on this rank's tokens);
2. permute: the ``T k`` (token, slot) copies sorted by expert, so that what goes to one
   rank is one contiguous block (:func:`permute`);
3. exchange the counts: one all-to-all of the tokens per expert, so that each rank knows
   how many rows it will receive from each rank (:func:`exchange_counts`);
4. dispatch: an all-to-all with uneven splits sends each block to its experts' rank
   (:func:`dispatch`);
5. compute: each local expert runs on the rows that arrived for it, in arrival order
   (source rank, then token); capacity, if any, keeps its first rows
   (:func:`run_local_experts`);
6. combine: the reverse all-to-all brings the results home (:func:`combine`); they are
   un-permuted (:func:`unpermute`) and summed, weighted by the gates; the shared expert is
   added.

The all-to-all is an autograd function whose backward is the same all-to-all the other
way (splits swapped): the gradient of what was sent is what comes back. The global batch
is the ranks' tokens concatenated rank after rank; in that order a rank receives each
expert's rows in the order one device meets them, so capacity drops the same rows. The
auxiliary loss needs every expert's global count: one all-reduce of ``E`` integers
(:func:`global_counts`); each rank returns its share of the loss, and the shares sum to
one device's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.expert_parallel.moe import MoEFFN, Routing, capacity


def expert_range(experts: int, ep: int, rank: int) -> range:
    """The experts rank ``rank`` of ``ep`` holds (a ValueError if ``ep`` does not divide)."""
    if ep < 1 or experts % ep:
        valid = [n for n in range(1, experts + 1) if experts % n == 0]
        raise ValueError(f"experts={experts} is not divisible by ep={ep}; valid ep: {valid}")
    local = experts // ep
    return range(rank * local, (rank + 1) * local)


@dataclass(frozen=True)
class Permuted:
    """A rank's (token, slot) copies in expert-major order."""

    tokens: torch.Tensor  # (T k, hidden): by expert, then token, then slot
    order: torch.Tensor  # (T k,): which (token, slot) row, flattened, each came from
    counts: torch.Tensor  # (E,) long: rows per expert


def permute(x: torch.Tensor, routing: Routing) -> Permuted:
    """``x`` (T, hidden) copied once per slot and sorted by expert (stable)."""
    flat = routing.experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=routing.probs.shape[-1])
    return Permuted(x[order // routing.experts.shape[1]], order, counts)


def undo_index(order: torch.Tensor) -> torch.Tensor:
    """The inverse permutation of ``order``."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)
    return inverse


def unpermute(rows: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Expert-major ``rows`` back in (token, slot) order."""
    return rows[undo_index(order)]


def exchange_counts(counts: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """One all-to-all of this rank's rows per expert: returns (ep, E/ep), row ``s`` the rows
    rank ``s`` will send to each of this rank's experts."""
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts.contiguous(), group=group)
    return received.view(group.size(), -1)


def global_counts(counts: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's rows per expert, summed: one all-reduce of ``E`` integers."""
    total = counts.clone()
    dist.all_reduce(total, group=group)
    return total


def _all_to_all(x: torch.Tensor, send: list[int], recv: list[int],
                group: dist.ProcessGroup) -> torch.Tensor:
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv,
                           input_split_sizes=send, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """Rows ``send[j]`` to rank ``j``, ``recv[j]`` from it; backward: the reverse."""

    @staticmethod
    def forward(ctx, x, send, recv, group):  # noqa: D102
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _all_to_all(x, send, recv, group)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        return _all_to_all(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def dispatch(tokens: torch.Tensor, send: list[int], recv: list[int],
             group: dist.ProcessGroup) -> torch.Tensor:
    """Each block of the permuted ``tokens`` to its experts' rank (``send[j]`` rows to rank
    ``j``); returns what arrived, ``recv[j]`` rows from rank ``j``, rank after rank."""
    return _AllToAll.apply(tokens, send, recv, group)


def combine(results: torch.Tensor, send: list[int], recv: list[int],
            group: dist.ProcessGroup) -> torch.Tensor:
    """The experts' results back to the ranks their tokens came from (the dispatch's
    ``send`` and ``recv``, reversed)."""
    return _AllToAll.apply(results, recv, send, group)


def run_local_experts(arrived: torch.Tensor, received: torch.Tensor, experts: nn.ModuleDict,
                      limit: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each local expert on its rows of ``arrived`` (``received`` (ep, E/ep): rows per
    source rank and local expert), the first ``limit`` of each in arrival order (None:
    all). Returns the results in the rows' places (zeros where dropped) and the rows each
    expert kept."""
    sizes = received.flatten()
    starts = (sizes.cumsum(0) - sizes).view_as(received)  # where each (rank, expert) begins
    rows, outputs, kept = [], [], []
    for local, expert in enumerate(experts.values()):
        mine = torch.cat([torch.arange(s, s + n, device=arrived.device) for s, n in
                          zip(starts[:, local].tolist(), received[:, local].tolist(),
                              strict=True)])
        mine = mine[:limit] if limit is not None else mine
        kept.append(len(mine))
        if len(mine):
            rows.append(mine)
            outputs.append(expert(arrived[mine]))
    results = torch.zeros_like(arrived)  # a dropped row sends back zeros
    if rows:
        results = results.index_copy(0, torch.cat(rows), torch.cat(outputs))
    return results, torch.tensor(kept)


@dataclass(frozen=True)
class Splits:
    """What one step of a rank moved: rows sent to and received from each rank."""

    sent: list[int]
    received: list[int]
    counts: torch.Tensor  # (E,) this rank's rows per expert
    arrived: torch.Tensor  # (ep, E/ep) rows from each rank for each local expert
    kept: torch.Tensor  # (E/ep,) rows each local expert kept


class ExpertParallelMoE(nn.Module):
    """One rank's part of a :class:`~helpers.expert_parallel.moe.MoEFFN` split over the
    ranks of ``group``: the router and shared expert copied, and this rank's experts
    (parameter names unchanged). Capacity is applied where the experts are, so the
    sender's ``last_routing.kept`` stays all True: a dropped row comes back as zeros, and
    the expert's rank records what it kept (``last_splits.kept``)."""

    def __init__(self, moe: MoEFFN, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.shape, self.group = moe.shape, group
        ids = expert_range(moe.shape.experts, group.size(), group.rank())
        self.router = copy.deepcopy(moe.router)
        self.experts = nn.ModuleDict({str(e): copy.deepcopy(moe.experts[str(e)]) for e in ids})
        self.shared = copy.deepcopy(moe.shared)
        self.last_routing: Routing | None = None
        self.last_splits: Splits | None = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's ``x`` (batch, seq, hidden) or (T, hidden) -> (its output, its share
        of the auxiliary loss)."""
        shape, group, ep = self.shape, self.group, self.group.size()
        tokens = x.reshape(-1, shape.hidden)
        routing = self.router(tokens)
        moved = permute(tokens, routing)
        totals = global_counts(moved.counts, group)
        received = exchange_counts(moved.counts, group)
        send, recv = moved.counts.view(ep, -1).sum(1).tolist(), received.sum(1).tolist()
        arrived = dispatch(moved.tokens, send, recv, group)
        everyone = int(totals.sum()) // shape.top_k  # the global batch's tokens
        results, kept = run_local_experts(arrived, received, self.experts,
                                          capacity(everyone, shape))
        back = unpermute(combine(results, send, recv, group), moved.order)
        out = (back.view(len(tokens), shape.top_k, -1) * routing.gates[..., None]).sum(1)
        if self.shared is not None:
            out = out + self.shared(tokens)
        self.last_routing = routing
        self.last_splits = Splits(send, recv, moved.counts, received, kept)
        return out.view_as(x), aux_share(routing.probs, totals, everyone)


def aux_share(probs: torch.Tensor, totals: torch.Tensor, tokens: int) -> torch.Tensor:
    """This rank's share of the load-balancing loss: ``E x sum_e f_e x (sum of its tokens'
    p_e) / T``, with ``f_e`` from the global counts ``totals``; the shares sum over ranks
    to the loss over the whole batch."""
    share = totals.to(probs.dtype) / int(totals.sum())
    return len(totals) * (share * (probs.sum(0) / tokens)).sum()


def sum_replicated_grads(layer: ExpertParallelMoE) -> None:
    """All-reduce (sum) the gradients of what every rank holds, the router and the shared
    expert, as a training step does; each expert's gradient stays on its rank."""
    shared = [] if layer.shared is None else list(layer.shared.parameters())
    for p in [*layer.router.parameters(), *shared]:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=layer.group)
