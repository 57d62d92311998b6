"""Lesson 06's typed result: what the worker measured, and every verdict, decided here once.

Tolerances (float32 unless said):
- the collectives: exact (``COLLECTIVE_TOLERANCE``), the same integers summed;
- outputs and gradients: ``PROOF_TOLERANCE``, the same sums in another order; the hand
  ZeRO stages against DDP and FSDP2 against the hand ZeRO-3 too (with 2 ranks these are
  the same sums in the same order: they agree exactly);
- weights after one Adam step: ``lr / 10``. Adam's first step moves a weight by
  lr x g / (|g| + eps); where a gradient is near zero its rounding shows in full, so the
  weights are a weaker test than the gradients, which carry the scale;
- ``bfloat16`` weights (FSDP2's mixed precision): outputs and gradients within
  ``BF16_RELATIVE_TOLERANCE`` of the float32 ones, relative to the whole tensor's norm:
  eight times bfloat16's relative spacing 2^-8, for a few dozen roundings in a row; its
  weights within ``2 lr`` of the float32 step (:func:`bf16_weights_tolerance`).
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers.comm.collectives import COLLECTIVES, AlphaBeta, fit_alpha_beta, ring_bytes
from helpers.core.checks import Proof
from helpers.core.sizes import format_bytes
from helpers.memory.estimate import estimate_transformer
from helpers.memory.ledger import DeviceMemory, Ledger
from helpers.memory.transformer import TransformerShape
from helpers.runs.contract import Record
from helpers.runs.data_parallel.config import DataParallelConfig
from helpers.runs.data_parallel.measured import (
    BucketSpan,
    ShardedParameter,
    Timeline,
    TrackedMemory,
)

PROOF_TOLERANCE = 1e-6
BF16_RELATIVE_TOLERANCE = 2**-5
COLLECTIVE_TOLERANCE = 0.0  # a collective's result equals the local computation exactly
ZERO_STAGE = {"DDP": 0, "ZeRO-1": 1, "ZeRO-2": 2, "ZeRO-3": 3}  # the runs with a ledger
# bytes each run sends per step, in all-reduces of the float32 weights (the ring formula):
# reduce-scatter + all-gather = 1; ZeRO-3 and FSDP2 gather twice (forward, backward) = 1.5;
# without resharding once; in bfloat16 each all-gather sends half (2 x 1/4 + 1/2 = 1)
ALL_REDUCES_PER_STEP = {"DDP": 1.0, "ZeRO-1": 1.0, "ZeRO-2": 1.0, "ZeRO-3": 1.5, "FSDP2": 1.5,
                        "FSDP2 no reshard": 1.0, "FSDP2 bf16": 1.0}


def weights_tolerance(lr: float) -> float:
    """Float32 weights after one Adam step: ``lr / 10`` (see the module's docstring)."""
    return lr / 10


def bf16_weights_tolerance(lr: float) -> float:
    """bfloat16 weights after one Adam step: ``2 lr``, one step from the same start (a
    gradient whose sign bfloat16 flipped moves its weight the other way)."""
    return 2 * lr


# -- the proofs, made once here from what the ranks measured (max |diff| over ranks) ------
def collective_check(name: str, diff: float) -> Proof:
    """A collective's result on every rank against the local computation: exact."""
    return Proof(name, diff, COLLECTIVE_TOLERANCE)


def step_proofs(lr: float, *, output: float, grads: float, weights: float) -> list[Proof]:
    """One run's step against one process on the whole batch."""
    return [Proof("output", output, PROOF_TOLERANCE), Proof("grads", grads, PROOF_TOLERANCE),
            Proof("weights", weights, weights_tolerance(lr))]


def zero_proofs(lr: float, *, grads: float, weights: float, output_vs_ddp: float,
                weights_vs_ddp: float) -> list[Proof]:
    """A hand ZeRO stage: its gradient slices and weights against one process, its output
    and weights against DDP's."""
    return [Proof("grads", grads, PROOF_TOLERANCE),
            Proof("weights", weights, weights_tolerance(lr)),
            Proof("output = DDP", output_vs_ddp, PROOF_TOLERANCE),
            Proof("weights = DDP", weights_vs_ddp, PROOF_TOLERANCE)]


def fsdp_proofs(lr: float, *, output: float, grads: float, weights: float,
                weights_vs_zero3: float) -> list[Proof]:
    """FSDP2 in float32: against one process, and weight for weight against the hand ZeRO-3."""
    return [*step_proofs(lr, output=output, grads=grads, weights=weights),
            Proof("weights = ZeRO-3", weights_vs_zero3, PROOF_TOLERANCE)]


def bf16_proofs(lr: float, *, output: float, grads: float, weights: float) -> list[Proof]:
    """FSDP2 in bfloat16: outputs and gradients relative to each tensor's norm, weights
    within :func:`bf16_weights_tolerance` of the float32 step."""
    return [Proof("output (rel.)", output, BF16_RELATIVE_TOLERANCE),
            Proof("grads (rel.)", grads, BF16_RELATIVE_TOLERANCE),
            Proof("weights", weights, bf16_weights_tolerance(lr))]


def no_sync_proof(lr: float, weights: float) -> Proof:
    """DDP with ``no_sync()`` accumulation: its weights against one process."""
    return Proof("weights", weights, weights_tolerance(lr))


@dataclass(frozen=True)
class Run(Record):
    """One technique's step on rank 0: what it held, what it sent, how it compares."""

    name: str
    sent: dict[str, float]  # bytes this rank sent, per collective
    calls: dict[str, int]
    proofs: list[Proof]
    ledger: DeviceMemory | None = None
    tracker: TrackedMemory | None = None  # FSDP2 runs: FSDPMemTracker's own peaks

    @property
    def total_sent(self) -> float:
        """Bytes this rank sent, every collective together."""
        return float(sum(self.sent.values()))

    @property
    def ok(self) -> bool:
        """Every proof of the run holds."""
        return all(p.ok for p in self.proofs)


@dataclass(frozen=True)
class DataParallelResult(Record):
    """Everything lesson 06's launch measured (rank 0's view; verdicts over all ranks)."""

    config: DataParallelConfig
    world_size: int
    backend: str
    reason: str
    parameters: int
    parameter_tensors: int
    collective_checks: list[Proof]
    timings: dict[str, list[tuple[int, float, list[float]]]]  # (bytes, sent, times) per size
    runs: dict[str, Run]
    first_step_buckets: int
    timeline: Timeline
    no_sync_all_reduces: list[int]
    no_sync_proof: Proof
    fsdp_parameter: ShardedParameter | None = None

    @property
    def buckets(self) -> list[BucketSpan]:
        """DDP's buckets from its second step on, in the order they were all-reduced."""
        return self.timeline.buckets

    # -- derived numbers -----------------------------------------------------------------
    @property
    def ok(self) -> bool:
        """Every proof of the launch holds."""
        return (all(p.ok for p in self.collective_checks) and self.no_sync_proof.ok
                and all(r.ok for r in self.runs.values()))

    @property
    def weight_bytes(self) -> int:
        """Bytes of the model's float32 weights (the S of a gradient all-reduce)."""
        return 4 * self.parameters

    @property
    def all_reduce_bytes(self) -> float:
        """Bytes a rank sends in one ring all-reduce of the weights (0 on one rank)."""
        return ring_bytes("all_reduce", self.world_size, self.weight_bytes)

    def formula_bytes(self, name: str) -> float:
        """What run ``name`` should send per step, by :data:`ALL_REDUCES_PER_STEP`."""
        return ALL_REDUCES_PER_STEP[name] * self.all_reduce_bytes

    def fits(self) -> dict[str, AlphaBeta]:
        """t = alpha + beta x bytes sent, per collective, fitted to the median times."""
        out = {}
        for name in COLLECTIVES:
            rows = self.timings[name]
            medians = [sorted(times)[len(times) // 2] for _, _, times in rows]
            out[name] = fit_alpha_beta(name, [sent for _, sent, _ in rows], medians)
        return out

    def proof_lines(self, *names: str) -> str:
        """One line per proof of the runs ``names`` (default: every run), run by run."""
        unknown = [n for n in names if n not in self.runs]
        if unknown:
            raise ValueError(f"no run {unknown[0]!r}; valid: {', '.join(self.runs)}")
        lines = []
        for name in names or self.runs:
            lines.append(f"{name}:")
            lines += ["  " + p.line(width=15) for p in self.runs[name].proofs]
        return "\n".join(lines)

    def tracker_table(self) -> str:
        """FSDPMemTracker's own peak per category, for each FSDP2 run (bytes on rank 0)."""
        runs = [r for r in self.runs.values() if r.tracker]
        cats = [c for c in TrackedMemory.__dataclass_fields__
                if any(getattr(r.tracker, c) for r in runs)]
        lines = [f"{'':<22}" + "".join(f"{r.name:>18}" for r in runs)]
        lines += [f"{c:<22}" + "".join(f"{format_bytes(getattr(r.tracker, c)):>18}" for r in runs)
                  for c in cats]
        return "\n".join(lines)

    def measured_ledgers(self) -> Ledger:
        """Rank 0's ledger per technique that has one (DDP and the hand ZeRO stages)."""
        return Ledger({n: r.ledger for n, r in self.runs.items() if r.ledger is not None},
                      note=f"measured on rank 0 of {self.world_size}")

    def predicted_ledgers(self) -> Ledger:
        """The same rows as :meth:`measured_ledgers`, predicted from the model's shape by
        ``helpers.memory``'s estimator (``dp`` ranks, ZeRO ``zero``)."""
        shape = TransformerShape.of(self.config.model)
        per_rank = self.config.batch // self.world_size
        rows = {}
        for name, stage in ZERO_STAGE.items():
            ledger = estimate_transformer(shape, batch=per_rank, seq=self.config.seq,
                                          optimizer="adam", dp=self.world_size, zero=stage)
            rows[name] = next(iter(ledger.rows.values()))
        return Ledger(rows, note=f"predicted for rank 0 of {self.world_size}")

    def bytes_table(self) -> str:
        """Bytes each rank sent per step, per collective, against the ring formula."""
        one = self.all_reduce_bytes
        head = (f"{'':<17}{'all-reduce':>12}{'reduce-sc.':>12}{'all-gather':>12}{'total':>12}"
                f"{'formula':>12}  x all-reduce")
        lines = [head]
        for name, run in self.runs.items():
            cells = [run.sent.get(c, 0.0) for c in ("all_reduce", "reduce_scatter", "all_gather")]
            lines.append(f"{name:<17}" + "".join(f"{format_bytes(c):>12}" for c in cells)
                         + f"{format_bytes(run.total_sent):>12}"
                         + f"{format_bytes(self.formula_bytes(name)):>12}"
                         + (f"  {run.total_sent / one:.2f}" if one else "  -"))
        return "\n".join(lines)

