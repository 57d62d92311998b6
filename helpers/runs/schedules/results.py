"""What lesson 04's launch returns: per schedule a ``ScheduleRun``, which derives every
number (step time, idle shares, the bubble in theory and replayed) from the recorded
events and decides the proof's verdict once, against ``PROOF_TOLERANCE``, and the
transfers' verdict once, against gloo's headers (``transfers``). The ``Verdict`` lines
are what lesson 04 shows in view, its tables one click down. Used by lesson 04,
``make bench`` and ``make gpu-check``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from helpers.core.checks import Proof, Verdict
from helpers.core.sizes import format_bytes
from helpers.core.timing import Timing
from helpers.pipeline.diagrams import ideal_timeline, schedule_order, sequence
from helpers.pipeline.events import COMPUTE, bubble_theory, idle_fractions
from helpers.pipeline.runtime import CHUNKS_PER_RANK
from helpers.pipeline.schedule import PROOF_TOLERANCE
from helpers.runs.contract import Record
from helpers.runs.schedules.config import SchedulesConfig
from helpers.runs.schedules.report import cost_split_report, transfers_table
from helpers.runs.schedules.transfers import RankTransfers, planned_sends

# The replay adds ticks in floating point: its idle share equals the formula's fraction up to
# rounding, far below one tick's share (at least 1 / (3 v M K) of the step here).
REPLAY_TOLERANCE = 1e-9
# relative, chosen: the first rank's 1F1B / GPipe peak, the input batch taken out, against
# K/M. Whole tensors are counted, so the rule holds almost exactly; 2% still fails one
# micro-batch more or fewer in flight (a change of 1/M, 25% at M = 4).
MEMORY_TOLERANCE = 0.02


def bubble_proof(what: str, idle: float, formula: float) -> Proof:
    """An order's idle share, replayed at ideal costs, against its formula's."""
    return Proof(what, abs(idle - formula), REPLAY_TOLERANCE)


@dataclass(frozen=True)
class StepProof(Record):
    """One pipelined step against one process: the largest differences, and the verdict."""

    output_diff: float
    grad_diff: float
    weight_diff: float

    @property
    def ok(self) -> bool:
        return max(self.output_diff, self.grad_diff, self.weight_diff) <= PROOF_TOLERANCE

    def proofs(self, name: str) -> list[Proof]:
        """Outputs, gradients and updated weights of ``name``'s step, against the tolerance."""
        return [Proof(f"{name} {what}", diff, PROOF_TOLERANCE) for what, diff in
                (("outputs", self.output_diff), ("gradients", self.grad_diff),
                 ("updated weights", self.weight_diff))]


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

    def verdict(self) -> Verdict:
        """Every schedule's step against one process, as one line."""
        return Verdict(f"all {len(self.runs)} schedules take one process's step",
                       [q for name, run in self.runs.items() for q in run.proof.proofs(name)])

    def replay_verdict(self) -> Verdict:
        """Each recorded order, replayed at ideal costs, against its bubble formula."""
        return Verdict("each replay at ideal costs idles its formula's share",
                       [bubble_proof(name, r.ideal_idle_fraction, r.bubble_theory)
                        for name, r in self.runs.items()])

    def order_verdict(self) -> Verdict:
        """Each rank's recorded order against ``schedule_order``, the order the lesson's
        diagrams draw: the count of actions out of place, none allowed."""
        proofs = []
        for name, run in self.runs.items():
            drawn = schedule_order(name, run.ranks, run.microbatches)
            for r in range(run.ranks):
                ran, plan = sequence(run.actions, r), sequence(drawn, r)
                wrong = sum(a != b for a, b in zip(ran, plan, strict=False))
                proofs.append(Proof(f"{name} rank {r}", wrong + abs(len(ran) - len(plan)), 0))
        return Verdict("every rank ran the order schedule_order gives", proofs)

    def memory_verdict(self) -> Verdict:
        """The first rank's 1F1B / GPipe peak, the input batch set aside, against K/M."""
        c, k = self.config, self.config.processes
        batch = c.batch * c.width * 4  # the input batch, float32, held whole on the first rank
        gpipe, one_f = (run.peak_activation_bytes[0] for run in
                        (self.runs["gpipe"], self.runs["1f1b"]))
        ratio, rule = (one_f - batch) / (gpipe - batch), k / c.microbatches
        return Verdict(f"on the first rank 1F1B holds K/M={rule:g} of GPipe's activations",
                       [Proof("rank 0, input batch aside", abs(ratio - rule),
                              MEMORY_TOLERANCE * rule)])

    def proof_table(self) -> str:
        """Every schedule's proof, its differences in columns."""
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
            bubble = (f"{theory:.1%}" if abs(replay - theory) <= REPLAY_TOLERANCE
                      else f"{replay:.1%} ≠ {theory:.1%}")
            lines.append(f"{name:<17}{step:>12}  {idle:<15}"
                         f"{run.free_communication_idle_fraction:>9.0%}  {bubble:<27}"
                         f"{'OK' if run.proof.ok else 'FAILED'}")
        lines.append(f"(step: mean ± std of {self.config.steps} timed steps, after "
                     f"{self.config.warmup} untimed warm-up step(s))")
        return "\n".join(lines)

    @property
    def replays_match_formulas(self) -> bool:
        return self.replay_verdict().ok  # unit costs: the same fraction, up to rounding

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
        """Where zero bubble's idle time comes from (``report.cost_split_report``)."""
        return cost_split_report(name, self.runs[name])

    @property
    def transfers_ok(self) -> bool:
        return all(run.transfers_ok for run in self.runs.values())

    def transfers_line(self) -> str:
        """The transfers' verdict (``transfers_table``'s last line) in one line."""
        checks = sum(len(run.transfers) for run in self.runs.values())
        read = all(run.wire_reason is None for run in self.runs.values())
        wire = "its wire: those tensors + gloo's headers" if read else "wire not read"
        return (f"{'✓' if self.transfers_ok else '✗'} each rank sent and received as planned; "
                f"{wire} ({checks} checks)")

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
        return transfers_table(self.runs, self.transfers_ok)

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
