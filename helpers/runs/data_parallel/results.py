"""Lesson 06's typed result: what the worker measured, and every verdict, decided here once.

Tolerances (float32 unless said):
- the collectives: exact (``COLLECTIVE_TOLERANCE``), the same integers summed;
- outputs and gradients: ``PROOF_TOLERANCE``, the same sums in another order; the hand
  ZeRO stages against DDP and FSDP2 against the hand ZeRO-3 too (with 2 ranks these are
  the same sums in the same order: they agree exactly);
- weights after one Adam step: ``lr / 10``. Adam's first step moves a weight by
  lr x g / (|g| + eps); where a gradient is near zero its rounding shows in full, so the
  weights are a weaker test than the gradients, which carry the scale;
- ``bfloat16`` weights (the hand ZeRO-3 and FSDP2 in mixed precision): outputs and
  gradients within ``BF16_RELATIVE_TOLERANCE`` of the float32 ones, relative to the whole
  tensor's norm: eight times bfloat16's unit roundoff 2^-8, chosen for a few dozen
  roundings in a row. Their weights are not compared with the float32 step: Adam's first
  step moves every weight by about lr whatever its gradient, so any two first steps agree
  within 2 lr and such a test could not fail. FSDP2's gradients and weights are compared
  instead with the hand ZeRO-3 that gathers in bfloat16 (``PROOF_TOLERANCE``).
- the bytes sent: in ``traffic`` (the calls against the plan, the wire against gloo).
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers.comm.collectives import (
    COLLECTIVES,
    AlphaBeta,
    fit_alpha_beta,
    gloo_bytes,
    ring_bytes,
)
from helpers.comm.headers import gloo_header_bytes
from helpers.core.checks import Proof, Verdict
from helpers.core.sizes import format_bytes
from helpers.memory.estimate import estimate_transformer
from helpers.memory.ledger import DeviceMemory, Ledger
from helpers.memory.transformer import TransformerShape
from helpers.runs.contract import Record
from helpers.runs.data_parallel.config import DataParallelConfig
from helpers.runs.data_parallel.measured import (
    BucketSpan,
    OverlapCost,
    ShardedParameter,
    Timeline,
    TrackedMemory,
)
from helpers.runs.data_parallel.traffic import (
    CollectiveSize,
    Traffic,
    TrafficCheck,
    check_traffic,
    planned,
)

PROOF_TOLERANCE = 1e-6
BF16_RELATIVE_TOLERANCE = 2**-5
COLLECTIVE_TOLERANCE = 0.0  # a collective's result equals the local computation exactly
ZERO_STAGE = {"DDP": 0, "ZeRO-1": 1, "ZeRO-2": 2, "ZeRO-3": 3}  # the runs with a ledger
FITTED_AGAINST = ("sent", "gloo", "ring")  # what an alpha-beta fit takes as a call's bytes


def weights_tolerance(lr: float) -> float:
    """Float32 weights after one Adam step: ``lr / 10`` (see the module's docstring)."""
    return lr / 10


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


def bf16_proofs(*, output: float, grads: float, grads_vs_hand: float | None = None,
                weights_vs_hand: float | None = None) -> list[Proof]:
    """A bfloat16 step: outputs and gradients against the float32 step, relative to each
    tensor's norm; FSDP2's also gradient for gradient and weight for weight against the hand
    ZeRO-3 in bfloat16."""
    proofs = [Proof("output (rel.)", output, BF16_RELATIVE_TOLERANCE),
              Proof("grads (rel.)", grads, BF16_RELATIVE_TOLERANCE)]
    if grads_vs_hand is not None:
        proofs.append(Proof("grads = ZeRO-3 bf16", grads_vs_hand, PROOF_TOLERANCE))
    if weights_vs_hand is not None:
        proofs.append(Proof("weights = ZeRO-3 bf16", weights_vs_hand, PROOF_TOLERANCE))
    return proofs


def no_sync_proofs(lr: float, *, grads: float, weights: float) -> list[Proof]:
    """DDP with ``no_sync()`` accumulation against one process on the whole batch: the
    gradients after the last micro-step (the sharp test: they carry the scale), then the
    updated weights."""
    return [Proof("grads", grads, PROOF_TOLERANCE), Proof("weights", weights, weights_tolerance(lr))]


@dataclass(frozen=True)
class Run(Record):
    """One technique's step on rank 0: what it held, what it sent, how it compares."""

    name: str
    traffic: Traffic  # the calls it issued, and their bytes three ways
    proofs: list[Proof]
    ledger: DeviceMemory | None = None
    tracker: TrackedMemory | None = None  # FSDP2 runs: FSDPMemTracker's own peaks

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
    unit_bytes: dict[str, list[int]]  # each unit's parameters' float32 bytes (the plans')
    wire_reason: str | None  # why the sockets were not read; None: they were
    gloo_threads: int | None  # the worker threads of the default gloo group (None: NCCL)
    collective_checks: list[Proof]
    sweep: list[CollectiveSize]  # per collective and size: bytes three ways, times
    runs: dict[str, Run]
    first_step_buckets: int
    timeline: Timeline  # DDP's last timed step
    overlap_cost: OverlapCost
    no_sync_all_reduces: list[int]
    no_sync_proofs: list[Proof]  # gradients after the last micro-step, then weights
    fsdp_parameter: ShardedParameter | None = None

    @property
    def buckets(self) -> list[BucketSpan]:
        """DDP's buckets from its second step on, in the order they were all-reduced."""
        return self.timeline.buckets

    # -- derived numbers -----------------------------------------------------------------
    @property
    def ok(self) -> bool:
        """Every proof of the launch holds."""
        return (all(p.ok for p in self.collective_checks) and self.no_sync_ok
                and all(r.ok for r in self.runs.values()))

    @property
    def no_sync_ok(self) -> bool:
        """``no_sync()`` accumulation took one process's step: gradients and weights."""
        return all(p.ok for p in self.no_sync_proofs)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the model's float32 weights (the S of a gradient all-reduce)."""
        return 4 * self.parameters

    @property
    def all_reduce_bytes(self) -> float:
        """Bytes a rank sends in one ring all-reduce of the weights (0 on one rank)."""
        return ring_bytes("all_reduce", self.world_size, self.weight_bytes)

    @property
    def bucket_cap(self) -> int:
        """DDP's bucket cap in bytes (``bucket_cap_mb`` x 2^20, as DDP converts it)."""
        return int(self.config.bucket_cap_mb * 2**20)

    def traffic_checks(self) -> list[TrafficCheck]:
        """Each run's bytes verdict (rank 0): its calls against its plan from the model's
        shapes, its wire against gloo's prediction plus the header allowance."""
        return [check_traffic(name, run.traffic, planned(name, self.unit_bytes),
                              self.world_size) for name, run in self.runs.items()]

    @property
    def traffic_ok(self) -> bool:
        """Every run's calls as planned and wire within bounds, and every swept call's."""
        return (all(c.ok for c in self.traffic_checks())
                and all(row.wire_ok is not False for row in self.sweep))

    def fits(self, against: str = "sent") -> dict[str, AlphaBeta]:
        """t = alpha + beta x bytes, per collective, fitted to the median times; a call's
        bytes are what rank 0 sent (``"sent"``: on the wire; where the wire was not read,
        by the backend's algorithms: gloo's, or NCCL's ring), or by ``"gloo"``'s
        algorithms, or by the ``"ring"`` formula."""
        if against not in FITTED_AGAINST:
            raise ValueError(f"against={against!r}; valid: {', '.join(FITTED_AGAINST)}")
        out = {}
        for name in COLLECTIVES:
            rows = [row for row in self.sweep if row.collective == name]
            medians = [sorted(row.times)[len(row.times) // 2] for row in rows]
            out[name] = fit_alpha_beta(name, [self._bytes(row, against) for row in rows],
                                       medians)
        return out

    def sent_bytes(self, collective: str, nbytes: int) -> float:
        """Bytes rank 0 sends for one call of ``collective`` on a full tensor of ``nbytes``,
        counted as :meth:`fits` counts them by default: where the wire was read, gloo's
        payload plus its headers (:func:`~helpers.comm.headers.gloo_header_bytes`); else
        gloo's payload, or on NCCL the ring formula. What a default fit's ``predict`` takes."""
        if self.backend != "gloo":
            return ring_bytes(collective, self.world_size, nbytes)
        payload = gloo_bytes(collective, self.world_size, nbytes)
        if self.wire_reason is not None:
            return payload
        return payload + gloo_header_bytes(collective, self.world_size, nbytes)

    def _bytes(self, row: CollectiveSize, against: str) -> float:
        if against == "sent" and row.wire is not None:
            return float(row.wire[0])
        if against == "ring" or (against == "sent" and self.backend != "gloo"):
            return row.ring
        return row.gloo[0]

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

    def verdict(self, claim: str, *names: str, only: tuple[str, ...] = ()) -> Verdict:
        """``claim`` with the proofs of the runs ``names`` (each named by its run; ``only``
        those of these ``what``s), as one line; ``"collectives"`` and ``"no_sync"`` name
        those checks."""
        extra = {"collectives": self.collective_checks, "no_sync": self.no_sync_proofs}
        unknown = [n for n in names if n not in self.runs and n not in extra]
        if unknown or not names:
            raise ValueError(f"no run {unknown[0] if unknown else None!r}; valid: "
                             f"{', '.join([*self.runs, *extra])}")
        return Verdict(claim, [Proof(f"{n}: {p.what}", p.max_diff, p.tolerance) for n in names
                               for p in (extra[n] if n in extra else self.runs[n].proofs)
                               if not only or p.what in only])

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
