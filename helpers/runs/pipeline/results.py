"""What lesson 03's launch returns: every proven run as a ``StageProof``, whose verdict is
decided here once, against ``PROOF_TOLERANCE``, and every timed run's step times; its
tables are what the lesson prints."""

from __future__ import annotations

from dataclasses import dataclass, field

from helpers.core.sizes import format_bytes
from helpers.core.timing import Timing
from helpers.pipeline.schedule import PROOF_TOLERANCE
from helpers.runs.contract import Record
from helpers.runs.pipeline.config import PipelineConfig


@dataclass(frozen=True)
class StageProof(Record):
    """One pipelined step against one process accumulating the same micro-batches."""

    schedule: str
    microbatches: int
    loss_pipelined: float
    loss_reference: float
    output_diff: float
    loss_diff: float
    grad_diff: float
    weight_diff: float
    worst_grad: str
    worst_weight: str
    peak_activation_bytes: list[int]  # per rank, kept for backward during a second step

    @property
    def ok(self) -> bool:
        return max(self.output_diff, self.loss_diff, self.grad_diff,
                   self.weight_diff) <= PROOF_TOLERANCE


@dataclass(frozen=True)
class TimedRun(Record):
    """Seconds per training step of one (schedule, micro-batches) run, all stages finished."""

    schedule: str
    microbatches: int
    times_s: list[float]


@dataclass(frozen=True)
class PipelineResult(Record):
    """Rank 0's result of one launch, typed.

    ``baselines``: one process running the whole model, ``single`` with one thread and
    ``single_threads`` with one per stage (empty when not asked for).
    """

    config: PipelineConfig
    backend: str
    proofs: list[StageProof]
    runs: list[TimedRun]
    baselines: dict[str, list[float]] = field(default_factory=dict)

    @property
    def single(self) -> Timing | None:
        """One process, whole model, one thread (rank 0, the others waiting)."""
        times = self.baselines.get("single")
        return Timing("one process, 1 thread (rank 0 alone)", times) if times else None

    @property
    def single_threads(self) -> Timing | None:
        """One process, whole model, one thread per stage (rank 0, the others waiting)."""
        times = self.baselines.get("single_threads")
        k = self.config.stages
        return Timing(f"one process, {k} threads (rank 0 alone)", times) if times else None

    @property
    def proofs_ok(self) -> bool:
        return all(p.ok for p in self.proofs)

    def timings(self) -> dict[tuple[str, int], Timing]:
        """Every timed run, keyed by (schedule, micro-batches)."""
        return {(r.schedule, r.microbatches): Timing(f"pipelined, {r.schedule}, "
                                                     f"M={r.microbatches}", r.times_s)
                for r in self.runs}

    def proof_table(self) -> str:
        lines = [f"backend: {self.backend}; {self.config.stages} processes, "
                 f"{self.config.threads} thread(s) each",
                 "proofs: one pipelined step vs one process accumulating the same micro-batches "
                 f"(tolerance {PROOF_TOLERANCE:g})",
                 f"  {'schedule':<8} {'M':>2}  {'outputs':>9} {'loss':>9} {'gradients':>9} "
                 f"{'weights':>9}"]
        for p in self.proofs:
            diffs = (p.output_diff, p.loss_diff, p.grad_diff, p.weight_diff)
            cells = " ".join(f"{f'≈ {d:.0e}':>9}" for d in diffs)
            lines.append(f"  {p.schedule:<8} {p.microbatches:>2}  {cells}  "
                         f"{'OK' if p.ok else 'FAILED'}")
        return "\n".join(lines)

    def peak(self, schedule: str, microbatches: int) -> list[int]:
        """Peak activation bytes per rank of one proven run."""
        for p in self.proofs:
            if (p.schedule, p.microbatches) == (schedule, microbatches):
                return p.peak_activation_bytes
        proven = [(p.schedule, p.microbatches) for p in self.proofs]
        raise ValueError(f"no proven run {schedule}, M={microbatches}; proven: {proven}")

    def peaks_table(self) -> str:
        """Peak activation bytes per rank, GPipe runs first, by M."""
        c = self.config
        lines = [f"peak activation bytes per rank, batch {c.batch} at {c.image_size}x"
                 f"{c.image_size}:",
                 f"  {'schedule':<8} {'M':>2}" + "".join(f"{'rank ' + str(r):>12}"
                                                        for r in range(c.stages))]
        for p in sorted(self.proofs, key=lambda p: (p.schedule != "gpipe", p.microbatches)):
            lines.append(f"  {p.schedule:<8} {p.microbatches:>2}" + "".join(
                f"{format_bytes(b):>12}" for b in p.peak_activation_bytes))
        return "\n".join(lines)
