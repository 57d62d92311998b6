"""The expert-parallel run's typed result, and every verdict, decided here.

Tolerance of the layer's proofs (derived, not chosen): the float64 rounding-error bound
of :func:`helpers.expert_parallel.bounds.moe_bounds`, computed from the one-process
layer and its whole input, element by element, for the output, the auxiliary loss (the
ranks' shares summed), the input's gradient and every parameter's gradient (the router's
and the shared expert's summed over the ranks, as a training step does; each expert's
from the rank that holds it). A quantity is proven when its largest ``|diff|`` is within
its largest bound (``proven``); ``elementwise`` asks more: every element within its own
bound. A token sent to the wrong expert, or a result to the wrong token, moves a value
by its own size, some 10^12 bounds or more beyond.

Bytes (exact): what each rank issued, counted on the rank (``CommMeter`` at the
dispatcher), must be what :func:`helpers.expert_parallel.traffic.ep_traffic` says for the
routing the ranks recorded: the counts' and the tokens' all-to-alls and the counts'
all-reduce forward, the two all-to-alls reversed backward, and nothing else; and the
replicated gradients' sum, an all-reduce by the ring formula. What left the sockets is
read beside them (gloo adds headers), not judged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from helpers.comm.collectives import ring_bytes
from helpers.comm.meter import ALL_TO_ALL
from helpers.core.checks import Proof, Verdict
from helpers.core.timing import RepeatsInMs
from helpers.expert_parallel.balance import imbalance
from helpers.expert_parallel.traffic import EPTraffic, ep_traffic, routing_matrix
from helpers.runs.contract import Record

ELEMENT_BYTES = 8  # float64
ALL_REDUCE = "all_reduce"


def _nonzero(bytes_per_collective: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in bytes_per_collective.items() if v}


@dataclass(frozen=True)
class RankSide(RepeatsInMs, Record):
    """What one rank routed, moved, kept, counted and measured."""

    rank: int
    experts: list[int]  # the experts it holds
    counts: list[int]  # its tokens' (token, slot) rows per expert, before any drop
    sent: list[int]  # rows it dispatched to each rank (its own included)
    received: list[int]  # rows it received from each rank
    arrived: list[int]  # rows that reached each of its experts
    kept: list[int]  # of those, the rows each expert computed (capacity)
    forward: dict[str, float]  # bytes counted per collective, forward (ring formula)
    backward: dict[str, float]  # backward
    grads: dict[str, float]  # summing the replicated gradients
    gloo_sent: float  # forward + backward, by gloo's algorithms
    wire_sent: int | None  # what its sockets sent for forward + backward; None: unread
    seconds: list[float]  # each timed forward+backward

    @property
    def dropped(self) -> int:
        """Rows that reached its experts past their capacity."""
        return sum(self.arrived) - sum(self.kept)


@dataclass(frozen=True)
class EPLayerResult(Record):
    """One MoE layer under expert parallelism against one process."""

    ep: int
    experts: int
    top_k: int
    hidden: int
    tokens: int  # per rank
    capacity: int | None  # most rows an expert takes (None: no limit)
    proofs: list[Proof]  # per quantity: largest |diff| against the largest bound
    ratios: dict[str, float]  # per quantity: the largest |diff| / bound, element by element
    ranks: list[RankSide]
    replicated: list[int]  # bytes of each gradient every rank holds (router, shared)
    reference_dropped: int  # assignments one process dropped

    @property
    def proven(self) -> Verdict:
        """Output, auxiliary loss and every gradient equal one process's, within the bound."""
        return Verdict(f"expert parallelism on {self.ep} ranks = one process", self.proofs)

    @property
    def worst_ratio(self) -> float:
        """The largest |diff| / bound of any element: at most 1 is within the bound."""
        return max(self.ratios.values())

    @property
    def elementwise(self) -> bool:
        """Every element within its own bound."""
        return self.worst_ratio <= 1

    @property
    def routing(self) -> torch.Tensor:
        """(ep, ep): rows rank s sent to rank d, from the counts the ranks recorded."""
        return routing_matrix(torch.tensor([r.counts for r in self.ranks]))

    def predicted(self, rank: int) -> EPTraffic:
        """What ``rank`` sends in one step, by :func:`ep_traffic`."""
        return ep_traffic(self.routing, rank, self.hidden, ELEMENT_BYTES, self.experts)

    @property
    def predicted_grads(self) -> float:
        """Bytes a rank sends summing the replicated gradients: one ring all-reduce each."""
        return sum((ring_bytes(ALL_REDUCE, self.ep, n) for n in self.replicated), 0.0)

    def rank_as_predicted(self, side: RankSide) -> bool:
        """One rank's counted bytes equal the prediction, collective by collective."""
        want = self.predicted(side.rank)
        return (_nonzero(side.forward) == _nonzero({ALL_TO_ALL: want.all_to_all_forward,
                                                    ALL_REDUCE: want.totals})
                and _nonzero(side.backward) == _nonzero({ALL_TO_ALL: want.all_to_all_backward})
                and _nonzero(side.grads) == _nonzero({ALL_REDUCE: self.predicted_grads}))

    @property
    def bytes_as_predicted(self) -> bool:
        """Every rank issued what the routing predicts, forward, backward and gradients."""
        return all(self.rank_as_predicted(side) for side in self.ranks)

    @property
    def tokens_per_expert(self) -> list[int]:
        """The global batch's (token, slot) rows per expert, before any drop."""
        return [sum(column) for column in zip(*(r.counts for r in self.ranks), strict=True)]

    @property
    def imbalance(self) -> float:
        """The busiest expert's rows over the mean: 1.0 is balanced."""
        return imbalance(torch.tensor(self.tokens_per_expert))

    @property
    def rank_imbalance(self) -> float:
        """The busiest rank's rows (its experts') over the mean."""
        return imbalance(torch.tensor(self.tokens_per_expert), self.ep)

    @property
    def dropped(self) -> int:
        """Assignments the experts dropped, all ranks together."""
        return sum(r.dropped for r in self.ranks)

    @property
    def drops_as_one_device(self) -> bool:
        """The ranks dropped as many assignments as one process."""
        return self.dropped == self.reference_dropped

    @property
    def verdicts(self) -> dict[str, bool]:
        """Every verdict of the run, by name (the terminal's JSON line prints these)."""
        return {"proven": self.proven.ok, "elementwise": self.elementwise,
                "bytes_as_predicted": self.bytes_as_predicted,
                "drops_as_one_device": self.drops_as_one_device}
