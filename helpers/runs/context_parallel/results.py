"""The context-parallel run's typed result, and every verdict, decided here.

Tolerance of the attention layer's proofs (derived): the rounding-error bound of
:mod:`helpers.context_parallel.bounds`, computed from the inputs, twice (the reference's
and the run's) for each of the output and the gradients of q, k and v. The worker
computes it once, from the whole inputs.

:func:`tolerance` (chosen) is the budget for what the bound does not cover, a whole small
Llama's gradients (lesson 10's training step): ``(terms + 10 cp)`` float64 epsilons of
``max(1, |largest value|)`` of the quantity in the one-process reference, ``terms`` the
most terms an element sums. Each addition or merge rounds by at most one epsilon of the
running value, so it covers every rounding of one sum with room; through a whole model it
is an assumption, confirmed by the margins the lesson prints. A lost or misplaced block
moves a value by its own size, some 10^12 budgets or more beyond.

Bytes: what each rank issued, counted on the rank (``CommMeter`` with its sends), must be
what :func:`helpers.context_parallel.traffic.layer_traffic` says, forward and backward,
for the ring formula and for gloo's algorithms; what left its sockets is read beside them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from helpers.context_parallel.traffic import LayerTraffic
from helpers.core.checks import Proof, Verdict
from helpers.core.timing import RepeatsInMs
from helpers.runs.contract import Record

EPS64 = torch.finfo(torch.float64).eps
QUANTITIES = ("output", "dq", "dk", "dv")


def tolerance(terms: int, cp: int, reference: torch.Tensor) -> float:
    """The budget for one quantity whose elements sum at most ``terms`` terms (see the
    module's docstring)."""
    return (terms + 10 * cp) * EPS64 * max(1.0, reference.abs().max().item())


@dataclass(frozen=True)
class RankSide(RepeatsInMs, Record):
    """What one rank counted and measured."""

    rank: int
    tokens: list[int]  # the true positions it held
    scores: int  # (query, key) score entries it computed (ring); all it was shown (others)
    forward_ring: float
    backward_ring: float
    forward_gloo: float
    backward_gloo: float
    wire_sent: int | None  # bytes its sockets sent for one forward+backward; None: unread
    seconds: list[float]  # each timed forward+backward
    computing: list[float]  # of each, the seconds ring attention computed (not waiting)

    @property
    def computing_ms(self) -> float:
        """Mean milliseconds of each pass spent computing (ring variants; else 0)."""
        return 1e3 * statistics.fmean(self.computing) if self.computing else float("nan")


@dataclass(frozen=True)
class NativeRun(Record):
    """PyTorch's ``context_parallel()`` on the same layer: its output against the hand
    version's, or the error it raised (type, message, and the torch source line)."""

    ran: bool
    max_diff: float | None = None
    error: str = ""
    where: str = ""


@dataclass(frozen=True)
class CPAttentionResult(Record):
    """One attention layer under context parallelism against one process."""

    variant: str
    split: str
    cp: int
    causal: bool
    proofs: list[Proof]
    ranks: list[RankSide]
    predicted_ring: LayerTraffic
    predicted_gloo: LayerTraffic
    native: NativeRun | None = None

    @property
    def proven(self) -> Verdict:
        """Output and the gradients of q, k, v equal one process's."""
        return Verdict(f"{self.variant} attention on {self.cp} ranks = one process",
                       self.proofs)

    @property
    def bytes_as_predicted(self) -> bool:
        """Every rank issued what the formula says, forward and backward, both ways."""
        want = (self.predicted_ring.forward, self.predicted_ring.backward,
                self.predicted_gloo.forward, self.predicted_gloo.backward)
        return all((r.forward_ring, r.backward_ring, r.forward_gloo, r.backward_gloo) == want
                   for r in self.ranks)

    @property
    def verdicts(self) -> dict[str, bool]:
        """Every verdict of the run, by name (the terminal's JSON line prints these)."""
        return {"proven": self.proven.ok, "bytes_as_predicted": self.bytes_as_predicted}

    @property
    def imbalance(self) -> float:
        """The most score entries a rank computed over the mean: 1.0 is balanced."""
        counts = [r.scores for r in self.ranks]
        return max(counts) / statistics.fmean(counts)
