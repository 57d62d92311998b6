"""Lesson 13's claims, one verdict line each, built from the results' proofs.

The tolerances are named in ``results`` (``EPSILONS``, ``ADAM_EPS``,
``ACTIVATION_TOLERANCE``, ``HEADER_BYTES``); here each claim gathers its proofs into one
``Verdict``, whose ``line()`` a lesson shows and whose ``table()`` it folds.
"""

from __future__ import annotations

import math

from helpers.core.checks import Proof, Verdict
from helpers.runs.llama_3d.results import ACTIVATION_TOLERANCE, LayoutRun, RankRecord


def _ranks(runs: list[LayoutRun]) -> list[tuple[str, RankRecord]]:
    return [(run.name, r) for run in runs for r in run.ranks]


def _ledger(runs: list[LayoutRun], activations: bool) -> list[Proof]:
    return [Proof(f"{layout}: {p.what}", p.max_diff, p.tolerance)
            for layout, r in _ranks(runs) for p in r.proofs()
            if ("activations" in p.what) == activations]


def trains(runs: list[LayoutRun], claim: str = "") -> Verdict:
    """Every run's losses and final weights against the one-process run (``claim`` names
    them; by default, how many layouts on how many ranks)."""
    most = max(run.layout.world_size for run in runs)
    return Verdict(claim or f"{len(runs)} layouts on 1 to {most} ranks train as one process",
                   [p for run in runs for p in run.proofs()])


def against(claim: str, run: LayoutRun, losses: list[float], weight_diff: float) -> Verdict:
    """Another run's ``losses`` and final weights' largest difference, held to ``run``'s
    tolerances against ``run``'s one-process reference (a planted bug must fail them)."""
    diffs = [abs(a - b) for a, b in zip(losses, run.reference, strict=True)]
    return Verdict(claim, [*(Proof(f"loss, step {k}", d, t) for k, (d, t) in
                             enumerate(zip(diffs, run.loss_tolerances, strict=True))),
                           Proof("final weights", weight_diff, run.weight_tolerance)])


def holds(runs: list[LayoutRun]) -> Verdict:
    """Weights, gradients and optimizer state of every rank: measured = predicted."""
    return Verdict("every rank holds the weights, gradients and optimizer state predicted",
                   _ledger(runs, activations=False))


def activations(runs: list[LayoutRun]) -> Verdict:
    """Every rank's peak activations against the estimator's, relative."""
    return Verdict(f"each rank's activations within {ACTIVATION_TOLERANCE:.0%} of the estimator's",
                   _ledger(runs, activations=True))


def sends(runs: list[LayoutRun]) -> Verdict:
    """The bytes of the calls each rank issued, per dimension and both ways (ring formula,
    gloo's algorithms), against ``ledger.predicted_sent``: exact."""
    proofs = []
    for layout, r in _ranks(runs):
        for way, got, want in (("ring", r.traffic.ring, r.predicted_ring),
                               ("gloo", r.traffic.gloo, r.predicted_gloo)):
            for dim in sorted(set(got) | set(want)):
                diff = abs(got[dim] - want[dim]) if dim in got and dim in want else math.inf
                proofs.append(Proof(f"{layout}: rank {r.rank} {dim} ({way})", diff, 0))
    return Verdict("along each mesh dimension, each rank sends the bytes its plan predicts",
                   proofs)


def on_the_wire(runs: list[LayoutRun]) -> Verdict | None:
    """Each rank's socket bytes beyond gloo's payload, allowed up to its headers (``inf``
    when below the payload); None where no rank's wire was read."""
    proofs = []
    for layout, r in _ranks(runs):
        t = r.traffic
        if t.wire is not None:
            extra = t.wire - t.total_gloo if t.wire >= t.total_gloo else math.inf
            proofs.append(Proof(f"{layout}: rank {r.rank}, wire - gloo", extra, t.headers))
    if not proofs:
        return None
    return Verdict("each rank's wire = gloo's bytes + at most its headers", proofs)
