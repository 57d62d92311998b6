"""What lesson 03's launch returns: every proven run as a ``StageProof``, whose verdict is
decided here once, against ``PROOF_TOLERANCE``, and every timed run's step times; its
tables are what the lesson prints, its ``Verdict`` lines what the lesson shows in view.
The activation-memory verdict (1F1B against GPipe, rank by rank) is decided here too,
against ``RATIO_TOLERANCE``; so is the broken run's (``broken``), which must fail."""

from __future__ import annotations

from dataclasses import dataclass, field

from helpers.core.checks import Proof, Verdict
from helpers.core.sizes import format_bytes
from helpers.core.timing import Timing
from helpers.pipeline.schedule import PROOF_TOLERANCE
from helpers.runs.contract import Record
from helpers.runs.pipeline.config import PipelineConfig

# relative, chosen: a rank's 1F1B / GPipe ratio of peak activation bytes, once the batch
# tensor it keeps whole is taken out, may differ from (micro-batches 1F1B holds) / M by 1%
# of that value. The counts are bytes of whole tensors, so the rule predicts them exactly;
# 1% still fails a schedule that holds one micro-batch more or fewer (a change of 1/M).
RATIO_TOLERANCE = 0.01


@dataclass(frozen=True)
class ActivationRatio:
    """One rank's peak activation bytes under 1F1B against GPipe, and the rule's ratio.

    GPipe holds all M micro-batches at once, 1F1B at most K - k on stage k: the ratio is
    min(K - k, M) / M. The first rank also keeps the input batch and the last the target
    batch, each one tensor whose micro-batches are views, held whole under both schedules:
    ``batch_bytes``, taken out of both peaks before comparing.
    """

    rank: int
    gpipe: int
    one_f_one_b: int
    batch_bytes: int
    expected: float

    @property
    def measured(self) -> float:
        return self.one_f_one_b / self.gpipe

    @property
    def without_batch(self) -> float:
        return (self.one_f_one_b - self.batch_bytes) / (self.gpipe - self.batch_bytes)

    @property
    def ok(self) -> bool:
        return abs(self.without_batch - self.expected) <= RATIO_TOLERANCE * self.expected


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

    def proofs(self, prefix: str = "") -> list[Proof]:
        """Outputs, loss, gradients and updated weights, each against ``PROOF_TOLERANCE``."""
        diffs = {"outputs": self.output_diff, "loss": self.loss_diff,
                 "gradients": self.grad_diff, "updated weights": self.weight_diff}
        return [Proof(f"{prefix}{what}", diff, PROOF_TOLERANCE) for what, diff in diffs.items()]


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
    work_s: float = 0.0  # rank 0's wall time in the worker's main: no start-up, no imports
    broken: StageProof | None = None  # GPipe summing its micro-batch gradients (break_it)

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

    def verdict(self) -> Verdict:
        """Every proven run's step against one process, as one line."""
        names = " and ".join(dict.fromkeys(p.schedule for p in self.proofs))
        return Verdict(f"{names} take one process's step",
                       [q for p in self.proofs for q in p.proofs(f"{p.schedule} M={p.microbatches} ")])

    def broken_verdict(self) -> Verdict:
        """The broken run's proof (``break_it``): its gradients are M times too large."""
        if self.broken is None:
            raise ValueError("no broken run in this result; valid: a launch with break_it")
        return Verdict(f"{self.broken.schedule} equals one process", self.broken.proofs())

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

    def activation_ratios(self, microbatches: int) -> list[ActivationRatio]:
        """Every rank's 1F1B / GPipe peak at M=``microbatches``, against the rule."""
        c, k = self.config, self.config.stages
        gpipe, one_f = self.peak("gpipe", microbatches), self.peak("1f1b", microbatches)
        kept = {0: c.batch * 3 * c.image_size**2 * 4}  # the input batch, float32
        kept[k - 1] = kept.get(k - 1, 0) + c.batch * c.num_classes * 4  # the one-hot target
        return [ActivationRatio(r, gpipe[r], one_f[r], kept.get(r, 0),
                                min(k - r, microbatches) / microbatches) for r in range(k)]

    def ratios_ok(self, microbatches: int) -> bool:
        return all(r.ok for r in self.activation_ratios(microbatches))

    def ratio_verdict(self, microbatches: int) -> Verdict:
        """Each rank's 1F1B / GPipe ratio, the batch tensor taken out, against the rule."""
        return Verdict(f"under 1F1B, stage k holds K-k of GPipe's M={microbatches} "
                       "micro-batches", [Proof(f"rank {r.rank}", abs(r.without_batch - r.expected),
                                               RATIO_TOLERANCE * r.expected)
                                         for r in self.activation_ratios(microbatches)])

    def ratio_table(self, microbatches: int) -> str:
        """1F1B / GPipe per rank: measured, without the batch tensor, and the rule."""
        m, k = microbatches, self.config.stages
        lines = [f"1F1B / GPipe peak activation bytes at M={m}, per rank, against the rule",
                 f"(stage k holds min(K-k, M) of the M micro-batches; tolerance "
                 f"{RATIO_TOLERANCE:.0%} of the rule's ratio):",
                 f"  {'rank':<5}{'measured':>9}  {'batch tensor kept':>18}  {'without it':>10}"
                 f"  {'rule':>9}"]
        for r in self.activation_ratios(m):
            kept = format_bytes(r.batch_bytes) if r.batch_bytes else "none"
            rule = f"{min(k - r.rank, m)}/{m}={r.expected:.3f}"
            lines.append(f"  {r.rank:<5}{r.measured:>9.3f}  {kept:>18}  {r.without_batch:>10.3f}"
                         f"  {rule:>9}  {'OK' if r.ok else 'FAILED'}")
        return "\n".join(lines)
