"""What lesson 04's launch returns: per schedule a ``ScheduleRun``, which derives every
number (step time, idle shares, the bubble in theory and replayed) from the recorded
events and decides the proof's verdict once, against ``PROOF_TOLERANCE``, and the
transfers' verdict once, against gloo's headers (``transfers``). Used by lesson 04,
``make bench`` and ``make gpu-check``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from helpers.core.sizes import format_bytes
from helpers.core.timing import Timing
from helpers.pipeline.events import COMPUTE, bubble_theory, idle_fractions
from helpers.pipeline.runtime import CHUNKS_PER_RANK
from helpers.pipeline.schedule import PROOF_TOLERANCE
from helpers.runs.contract import Record
from helpers.runs.schedules.config import SchedulesConfig
from helpers.runs.schedules.report import ideal_timeline
from helpers.runs.schedules.transfers import (
    HEADERS_PER_RECEIVE,
    HEADERS_PER_SEND,
    RankTransfers,
    planned_sends,
)


@dataclass(frozen=True)
class StepProof(Record):
    """One pipelined step against one process: the largest differences, and the verdict."""

    output_diff: float
    grad_diff: float
    weight_diff: float

    @property
    def ok(self) -> bool:
        return max(self.output_diff, self.grad_diff, self.weight_diff) <= PROOF_TOLERANCE


def _idle(rows: list[dict], ranks: int) -> float:
    span = max(a["end"] for a in rows)
    return 1 - sum(a["end"] - a["start"] for a in rows) / (span * ranks)


@dataclass(frozen=True)
class ScheduleRun(Record):
    """What one schedule did on every rank; every number below comes from its events."""

    name: str
    ranks: int
    microbatches: int
    proof: StepProof
    times_s: list[float]
    actions: list[dict] = field(repr=False)
    start_ns: int
    end_ns: int
    peak_activation_bytes: list[int]  # per rank, in the metered step
    memory_actions: list[dict] = field(repr=False)  # compute actions of the metered step
    memory_start_ns: int
    message_bytes: int  # one micro-batch's activation (or its gradient): what a send carries
    transfers: list[RankTransfers]  # per rank, in the metered step
    wire_reason: str | None  # why the sockets were not read (None: they were)

    @property
    def chunks_per_rank(self) -> int:
        return CHUNKS_PER_RANK[self.name]

    def planned_sends(self, rank: int) -> int:
        """Messages ``rank`` sends (and receives) in one step, by the chunks' placement."""
        return planned_sends(rank, self.ranks, self.chunks_per_rank, self.microbatches)

    @property
    def transfers_ok(self) -> bool:
        """Every rank posted the planned sends and receives with the planned bytes, and its
        sockets sent those bytes plus at most gloo's headers."""
        return all(t.ok(self.planned_sends(r), self.message_bytes)
                   for r, t in enumerate(self.transfers))

    @property
    def timing(self) -> Timing:
        """The timed steps, as every other timing of the course."""
        return Timing(self.name, self.times_s)

    @property
    def step_s(self) -> float:
        return self.timing.mean

    @property
    def step_std_s(self) -> float:
        return self.timing.std

    @property
    def idle_fraction(self) -> list[float]:
        """Measured idle share of the step, per rank."""
        return idle_fractions(self.actions, self.ranks, self.start_ns, self.end_ns)

    @property
    def ideal(self) -> list[dict]:
        """The same order at unit costs, sending free: the schedule's own tick diagram."""
        return ideal_timeline(self.actions, self.ranks, self.chunks_per_rank)

    @property
    def ideal_idle_fraction(self) -> float:
        return _idle(self.ideal, self.ranks)

    @property
    def free_communication_idle_fraction(self) -> float:
        """The same order with each action's measured cost, sending free."""
        return _idle(ideal_timeline(self.actions, self.ranks, self.chunks_per_rank,
                                    measured_costs=True), self.ranks)

    @property
    def bubble_theory(self) -> float:
        return bubble_theory(self.name, self.ranks, self.microbatches, self.chunks_per_rank)

    def seconds(self, kind: str) -> list[float]:
        """Seconds each rank spent in actions of ``kind`` (F, B, I, W or wait)."""
        return [sum(a["end_ns"] - a["start_ns"] for a in self.actions
                    if a["rank"] == r and a["kind"] == kind) / 1e9 for r in range(self.ranks)]

    def numbers(self) -> dict:
        """The numbers as JSON (``make bench``, ``make gpu-check``)."""
        return {"step_s": self.step_s, "step_std_s": self.step_std_s,
                "idle_fraction": self.idle_fraction, "bubble_theory": self.bubble_theory,
                "ideal_idle_fraction": self.ideal_idle_fraction,
                "free_communication_idle_fraction": self.free_communication_idle_fraction,
                "seconds_by_kind": {k: t for k in COMPUTE if any(t := self.seconds(k))},
                "peak_activation_bytes": self.peak_activation_bytes,
                "transfers": [t.to_dict() for t in self.transfers],
                "wire_reason": self.wire_reason, "transfers_ok": self.transfers_ok,
                "proof": self.proof.to_dict(), "proof_ok": self.proof.ok}


@dataclass(frozen=True)
class SchedulesResult(Record):
    """Rank 0's result of one launch, typed; its reports are what lesson 04 prints."""

    config: SchedulesConfig
    backend: str
    runs: dict[str, ScheduleRun]

    @property
    def proofs_ok(self) -> bool:
        return all(run.proof.ok for run in self.runs.values())

    def proof_table(self) -> str:
        lines = [f"backend: {self.backend}; proofs against one process (tolerance "
                 f"{PROOF_TOLERANCE:g}):",
                 f"  {'schedule':<17} {'chunks/rank':>11} {'outputs':>9} {'gradients':>10} "
                 f"{'weights':>9}"]
        for name, run in self.runs.items():
            p = run.proof
            lines.append(f"  {name:<17} {run.chunks_per_rank:>11} {p.output_diff:>9.1e} "
                         f"{p.grad_diff:>10.1e} {p.weight_diff:>9.1e}  "
                         f"{'OK' if p.ok else 'FAILED'}")
        return "\n".join(lines)

    def table(self) -> str:
        """Step time (mean ± std of the timed steps), idle per rank, the bubble with free
        sends, the replay's bubble (one number where it equals the formula's), proof."""
        lines = [f"{'schedule':<17}{'step (ms)':>12}  {'idle per rank':<15}{'free comm':>9}  "
                 f"{'bubble (replay = formula)':<27}proof"]
        for name, run in self.runs.items():
            idle = " ".join(f"{f:.0%}" for f in run.idle_fraction)
            step = f"{run.step_s * 1e3:.0f} ± {run.step_std_s * 1e3:.0f}"
            replay, theory = run.ideal_idle_fraction, run.bubble_theory
            bubble = (f"{theory:.1%}" if abs(replay - theory) < 1e-9
                      else f"{replay:.1%} ≠ {theory:.1%}")
            lines.append(f"{name:<17}{step:>12}  {idle:<15}"
                         f"{run.free_communication_idle_fraction:>9.0%}  {bubble:<27}"
                         f"{'OK' if run.proof.ok else 'FAILED'}")
        lines.append(f"(step: mean ± std of {self.config.steps} timed steps, after "
                     f"{self.config.warmup} untimed warm-up step(s))")
        return "\n".join(lines)

    @property
    def replays_match_formulas(self) -> bool:
        # unit costs: the replay and the formula are the same fraction, up to float rounding
        return all(abs(r.ideal_idle_fraction - r.bubble_theory) < 1e-9 for r in self.runs.values())

    def replay_report(self) -> str:
        return "\n".join(f"{name:<17} replay at ideal costs idles {r.ideal_idle_fraction:.1%} = "
                         f"formula {r.bubble_theory:.1%}" for name, r in self.runs.items())

    def wait_report(self) -> str:
        """Backward / forward time per rank, and the share of the step spent waiting."""
        lines = []
        for name, run in self.runs.items():
            backward = [b + i for b, i in zip(run.seconds("B"), run.seconds("I"), strict=True)]
            ratio = " ".join(f"{b / f:.1f}" for b, f in zip(backward, run.seconds("F"),
                                                             strict=True))
            share = " ".join(f"{w / run.step_s:.0%}" for w in run.seconds("wait"))
            lines.append(f"{name:<17} backward/forward time per rank: {ratio:<10} waiting on "
                         f"sends and receives: {share}")
        return "\n".join(lines)

    def cost_split_report(self, name: str = "zero_bubble") -> str:
        """Where zero bubble's idle time comes from: its measured I/F and W/F per rank, then
        its idle share three ways (the formula with I = W = F, the same order replayed with
        the measured costs and free sends, and measured)."""
        run = self.runs[name]
        f, i, w = run.seconds("F"), run.seconds("I"), run.seconds("W")
        lines = [f"{name}, rank {r}: I/F = {i[r] / f[r]:.2f}, W/F = {w[r] / f[r]:.2f} "
                 "(the formula assumes 1 and 1)" for r in range(run.ranks)]
        lines += [f"idle share: {run.bubble_theory:.1%} with I = W = F (formula and replay)",
                  f"            {run.free_communication_idle_fraction:.1%} replaying the same "
                  "order with this run's measured costs, sending free",
                  "            " + " ".join(f"{x:.0%}" for x in run.idle_fraction)
                  + " measured, per rank"]
        return "\n".join(lines)

    @property
    def transfers_ok(self) -> bool:
        return all(run.transfers_ok for run in self.runs.values())

    @property
    def message_bytes(self) -> int:
        """What one send carries: one micro-batch's activation or gradient (every block
        keeps the width, so every cut's is the same size)."""
        return next(iter(self.runs.values())).message_bytes

    def sent_bytes(self, *names: str) -> list[list[int]]:
        """Tensor bytes each rank sent in the counted step, of each schedule named."""
        return [[t.sent_bytes for t in self.runs[n].transfers] for n in names]

    def transfers_table(self) -> str:
        """Per schedule and rank: sends, receives, the tensors' bytes, the wire's, and
        whether the difference is gloo's headers exactly (✓) or what they allow."""
        headers = f"= {HEADERS_PER_SEND}·s + {HEADERS_PER_RECEIVE}·r"
        lines = [f"{'schedule':<17}{'rank':>5}{'sends s':>9}{'recvs r':>9}{'tensors (B)':>12}"
                 f"{'on the wire (B)':>17}{'wire - tensors':>15}  {headers}"]
        for name, run in self.runs.items():
            for r, t in enumerate(run.transfers):
                wire, extra, same = "-", "-", ""
                if t.wire_sent is not None:
                    wire, extra = f"{t.wire_sent:,}", f"{t.wire_sent - t.sent_bytes:,}"
                    same = "✓" if t.wire_sent - t.sent_bytes == t.headers else (
                        f"≠ {t.headers:,}")
                lines.append(f"{name:<17}{r:>5}{t.sends:>9}{t.receives:>9}{t.sent_bytes:>12,}"
                             f"{wire:>17}{extra:>15}  {same}")
        reasons = {run.wire_reason for run in self.runs.values()} - {None}
        lines += [f"wire not read: {reason}" for reason in sorted(reasons)]
        verdict = "OK" if self.transfers_ok else "FAILED"
        lines.append(f"every rank: sends, receives, tensor bytes as planned; wire within "
                     f"[tensors, tensors + headers]  {verdict}")
        return "\n".join(lines)

    def peaks_table(self) -> str:
        """Peak activation bytes per rank, per schedule."""
        lines = [f"{'schedule':<17}" + "".join(f"{'rank ' + str(r):>12}"
                                               for r in range(self.config.processes))]
        lines += [f"{name:<17}" + "".join(f"{format_bytes(b):>12}"
                                          for b in run.peak_activation_bytes)
                  for name, run in self.runs.items()]
        return "\n".join(lines)

    def peaks(self, *names: str) -> list[list[int]]:
        """Peak activation bytes per rank of each schedule named."""
        return [self.runs[n].peak_activation_bytes for n in names]

    def numbers(self) -> dict:
        return {"sizes": self.config.to_dict(), "backend": self.backend,
                **{name: run.numbers() for name, run in self.runs.items()}}
