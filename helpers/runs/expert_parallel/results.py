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

Time (measured, no verdict): after the proof, each rank times all-to-alls with no meter
running, a barrier before each call, warm-up calls excluded. First lesson 06's fit,
``t = alpha + beta x bytes``, made here for ``all_to_all_single`` on this group: even
splits, each rank sending ``B`` bytes to the others (and receiving ``B``), at a few sizes.
An all-to-all is over when its last rank is done, and the layer's next step waits for it,
so a call's time is the slowest rank's (per repeat, the max over ranks) and each size's
time the median over repeats (:attr:`EPLayerResult.a2a_fit`). Then the layer's own
dispatch and combine, with the splits its router chose: rank ``r`` sends ``s_r`` bytes and
receives ``q_r``. Per rank, its measured mean +- std stands beside the fit at ``s_r`` (what
it sends); for the call as a whole (the slowest rank, per repeat) the fit is read at the
busiest rank's bytes, ``max_r max(s_r, q_r)``: the fit was measured where every rank sent
and received the same, and with uneven splits the rank that moves the most, out or in,
finishes last (:meth:`EPLayerResult.a2a_rows`). The bytes are the payload, what
``CommMeter`` counts; gloo's headers, a fixed 144 B per other rank and call, fall in alpha.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch

from helpers.comm.collectives import AlphaBeta, fit_alpha_beta, ring_bytes
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
    a2a_seconds: list[list[float]]  # the fit's all-to-alls: per size, each timed call
    dispatch_seconds: list[float]  # each timed call of the layer's dispatch all-to-all
    combine_seconds: list[float]  # each timed call of its combine all-to-all

    @property
    def dropped(self) -> int:
        """Rows that reached its experts past their capacity."""
        return sum(self.arrived) - sum(self.kept)

    @property
    def all_to_all_sent(self) -> tuple[float, float]:
        """Bytes its all-to-alls sent (counted): (forward, backward)."""
        return self.forward.get(ALL_TO_ALL, 0.0), self.backward.get(ALL_TO_ALL, 0.0)


@dataclass(frozen=True)
class A2ATime(RepeatsInMs):
    """One all-to-all of the layer (dispatch or combine) timed, beside the fit's prediction."""

    call: str  # "dispatch" or "combine"
    who: str  # "rank r", or "slowest rank": per repeat the max over ranks
    sent: int  # bytes sent to the other ranks (the slowest rank's row: the most any sent)
    received: int  # bytes received from them (the slowest rank's row: the most any received)
    seconds: list[float]  # each timed call
    predicted_s: float  # the fit's seconds for this row's bytes

    @property
    def predicted_ms(self) -> float:
        return 1e3 * self.predicted_s

    @property
    def median_ms(self) -> float:
        """The median call: a spike (another process on the cores) moves it least."""
        return 1e3 * statistics.median(self.seconds) if self.seconds else float("nan")

    @property
    def predicted_ok(self) -> bool:
        """The prediction is a time: positive and finite (no verdict on the measurement)."""
        return math.isfinite(self.predicted_s) and self.predicted_s > 0


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
    a2a_sent: list[int]  # bytes each rank sent to the others per call, at each fit size

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
    def a2a_fit(self) -> AlphaBeta:
        """t = alpha + beta x bytes each rank sends, for ``all_to_all_single`` on this group:
        at each size, per repeat the slowest rank's seconds, the median over repeats."""
        if len(self.a2a_sent) < 2:
            raise ValueError(f"ep={self.ep}: no all-to-all was timed (one rank sends nothing);"
                             " valid: a run on 2 or more ranks")
        times = []
        for size in range(len(self.a2a_sent)):
            calls = zip(*(r.a2a_seconds[size] for r in self.ranks), strict=True)
            times.append(statistics.median(max(call) for call in calls))
        return fit_alpha_beta(ALL_TO_ALL, [float(b) for b in self.a2a_sent], times)

    def a2a_rows(self) -> list[A2ATime]:
        """The layer's dispatch and combine, each rank's time against the fit at what it
        sends, then the call's (the slowest rank per repeat) against the fit at the busiest
        rank's bytes."""
        fit, rows = self.a2a_fit, []
        dispatch = [self.predicted(r.rank).dispatch for r in self.ranks]
        combine = [self.predicted(r.rank).combine for r in self.ranks]  # what it received
        busiest = max(max(d, c) for d, c in zip(dispatch, combine, strict=True))
        for call, sent, received, attr in (("dispatch", dispatch, combine, "dispatch_seconds"),
                                           ("combine", combine, dispatch, "combine_seconds")):
            for side in self.ranks:
                rows.append(A2ATime(call, f"rank {side.rank}", sent[side.rank],
                                    received[side.rank], getattr(side, attr),
                                    fit.predict(sent[side.rank])))
            slowest = [max(c) for c in zip(*(getattr(r, attr) for r in self.ranks), strict=True)]
            rows.append(A2ATime(call, "slowest rank", max(sent), max(received), slowest,
                                fit.predict(busiest)))
        return rows

    def a2a_table(self) -> str:
        """The fit, then the layer's all-to-alls measured beside it (milliseconds)."""
        fit = self.a2a_fit
        head = (f"all_to_all_single on {self.ep} ranks, fitted at {len(self.a2a_sent)} sizes "
                f"({min(self.a2a_sent):,} to {max(self.a2a_sent):,} B sent per rank):\n"
                f"  alpha = {fit.alpha_s * 1e6:.0f} us, 1/beta = {fit.bandwidth / 1e9:.2f} GB/s;"
                " residuals " + " ".join(f"{r:+.0%}" for r in fit.relative_residuals))
        lines = [head, f"{'call':<9}{'who':<9}{'sent B':>8}{'recv B':>8}"
                       f"{'mean +- std ms':>18}{'median':>8}{'fit ms':>8}  fit read at"]
        for row in self.a2a_rows():
            at = "its bytes" if row.who.startswith("rank") else "the busiest's"
            who = row.who.replace("slowest rank", "slowest")
            lines.append(f"{row.call:<9}{who:<9}{row.sent:>8,}{row.received:>8,}"
                         f"{row.mean_ms:>9.3f} +- {row.std_ms:<5.3f}{row.median_ms:>8.3f}"
                         f"{row.predicted_ms:>8.3f}  {at}")
        lines.append("(slowest: per repeat, the later of the ranks; ms: milliseconds)")
        return "\n".join(lines)

    @property
    def verdicts(self) -> dict[str, bool]:
        """Every verdict of the run, by name (the terminal's JSON line prints these)."""
        return {"proven": self.proven.ok, "elementwise": self.elementwise,
                "bytes_as_predicted": self.bytes_as_predicted,
                "drops_as_one_device": self.drops_as_one_device}
