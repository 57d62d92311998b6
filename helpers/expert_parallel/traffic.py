"""What each rank sends in one step of an expert-parallel layer, from the routing alone.

Unlike the collectives of data or tensor parallelism, the all-to-all's volume is not fixed
by the tensor sizes: it depends on where the router sent the tokens. With ``M[s, d]`` the
(token, slot) rows rank ``s`` sends to rank ``d`` (its tokens routed to ``d``'s experts),
rank ``r`` sends, per step, with ``hidden x element_bytes`` bytes a row:

- the counts: ``E/ep`` integers to each other rank (``(ep - 1) E/ep x 8`` bytes);
- dispatch, forward: ``sum_{d != r} M[r, d]`` rows (its own block stays home);
- combine, forward: what it received, sent back: ``sum_{s != r} M[s, r]`` rows;
- backward: the same two reversed: the combine's gradient goes out as the dispatch went,
  the dispatch's gradient as the combine went (when the layer's input needs a gradient,
  as inside a model; else autograd skips that one).

Besides the all-to-alls, the auxiliary loss and the capacity need every expert's global
count: an all-reduce of ``E`` integers (by the ring formula, ``2 (ep - 1)/ep x 8 E``).
A balanced router sends ``(ep - 1)/ep`` of the rows away; a skewed one sends more to the
overloaded rank, which then sends the most back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from helpers.comm.collectives import ring_bytes

COUNT_BYTES = 8  # the counts are int64


def routing_matrix(counts: torch.Tensor) -> torch.Tensor:
    """``M`` (ep, ep): rows rank ``s`` sends to rank ``d``, from ``counts`` (ep, E), each
    rank's rows per expert (experts split evenly, in order)."""
    ep, experts = counts.shape
    if experts % ep:
        raise ValueError(f"experts={experts} is not divisible by ep={ep}")
    return counts.view(ep, ep, experts // ep).sum(-1)


@dataclass(frozen=True)
class EPTraffic:
    """Bytes one rank sends in one step, per all-to-all (and the counts' all-reduce)."""

    counts: int  # the all-to-all of the counts
    dispatch: int  # forward
    combine: int  # forward
    dispatch_back: int  # backward: the combine's gradient, sent as the dispatch was
    combine_back: int  # backward: the dispatch's gradient, sent as the combine was
    totals: float  # the all-reduce of the global counts (ring formula)

    @property
    def all_to_all_forward(self) -> int:
        return self.counts + self.dispatch + self.combine

    @property
    def all_to_all_backward(self) -> int:
        return self.dispatch_back + self.combine_back

    @property
    def all_to_all(self) -> int:
        """Every all-to-all of the step, forward and backward."""
        return self.all_to_all_forward + self.all_to_all_backward


def ep_traffic(matrix: torch.Tensor, rank: int, hidden: int, element_bytes: int,
               experts: int) -> EPTraffic:
    """What rank ``rank`` sends per step, for routing ``matrix`` (:func:`routing_matrix`),
    rows of ``hidden`` elements of ``element_bytes`` each, and ``experts`` experts."""
    ep = matrix.shape[0]
    if not 0 <= rank < ep:
        raise ValueError(f"rank={rank!r}; valid: 0 to {ep - 1}")
    row = hidden * element_bytes
    out = int(matrix[rank].sum() - matrix[rank, rank]) * row
    back = int(matrix[:, rank].sum() - matrix[rank, rank]) * row
    counts = (ep - 1) * (experts // ep) * COUNT_BYTES
    return EPTraffic(counts, out, back, out, back,
                     ring_bytes("all_reduce", ep, experts * COUNT_BYTES))
