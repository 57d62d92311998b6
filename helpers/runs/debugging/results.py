"""Lesson 12's typed results, and their verdicts, decided here.

Drills: a drill is *named* when the Flight Recorder diagnosis finds the kind of fault the
drill plants, blames exactly the planted ranks, and names the operation the others wait
in (:func:`helpers.debugging.hangs.expected_finding`); a launch is *clean* when none of its
processes is alive afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers.debugging.hangs import Finding, blamed_by_checks, expected_finding
from helpers.debugging.intervals import clip, length
from helpers.models.llama import LMConfig
from helpers.runs.contract import Record


@dataclass(frozen=True)
class DrillsEnded(Record):
    """Rank 0's result when the drills ended by themselves (``--tools``: errors, no hang)."""

    drills: list[str]


@dataclass(frozen=True)
class RankEvidence(Record):
    """What one rank wrote before it went down."""

    rank: int
    pid: int
    seconds: float
    groups: dict[str, str]  # drill -> its process group's name
    stacks: dict[str, list[str]]  # drill -> the waiting thread's stack (still waiting only)
    errors: dict[str, str]  # drill -> the error it raised (first line)
    debug: str  # TORCH_DISTRIBUTED_DEBUG


@dataclass(frozen=True)
class DrillOutcome(Record):
    """One drill: what the dumps say, where each rank was, what it raised."""

    drill: str
    culprit: int
    finding: Finding | None  # from the Flight Recorder dumps (None: a --tools run)
    stacks: dict[int, list[str]]  # rank -> its drill thread's stack, innermost last
    errors: dict[int, str]  # rank -> the error it raised

    def doing(self, rank: int) -> str:
        """The call or function ``rank``'s drill thread was in ("" if it was not waiting)."""
        stack = self.stacks.get(rank) or [""]
        return stack[-1].rsplit(" in ", 1)[-1]

    def site(self, rank: int) -> str:
        """The innermost frame of ``rank``'s drill thread outside torch: the drill's line."""
        outside = [f for f in self.stacks.get(rank, []) if "distributed_c10d.py" not in f]
        return outside[-1] if outside else ""

    @property
    def blamed_by_checks(self) -> tuple[tuple[int, ...], str]:
        """The ranks and operation that the errors of DETAIL's checks or the
        ``monitored_barrier`` name (a ``--tools`` run)."""
        return blamed_by_checks(self.errors)

    @property
    def named(self) -> bool:
        """The dumps blame the planted ranks for the planted kind of fault and name the
        collective the others wait in, and the blamed ranks' stacks show the planted call."""
        kind, culprits, waiting_in, doing = expected_finding(self.drill, self.culprit)
        f = self.finding
        if f is None:
            return False
        return ((f.kind, f.culprits, f.waiting_in) == (kind, culprits, waiting_in)
                and all(self.doing(r) == doing for r in culprits))

    def line(self) -> str:
        """The diagnosis in one line (its verdict is :attr:`named`)."""
        if self.finding is None:
            ranks, op = self.blamed_by_checks
            named = f"rank {', '.join(map(str, ranks))} ({op})" if ranks else "no rank"
            return f"{self.drill}: the checks' errors name {named}"
        at = "; ".join(f"rank {r} is in {self.doing(r)} ({self.site(r)})"
                       for r in self.finding.culprits)
        return f"{self.drill}: {self.finding.line()}; {at}"


@dataclass(frozen=True)
class DrillRun(Record):
    """The drills of one launch: how it ended and what each one left behind."""

    outcomes: list[DrillOutcome]
    ended: str  # how the launch ended, in the launcher's words (first line)
    seconds: float  # the launch, from start to its last process gone
    left_running: list[int]  # pids of the launch's ranks still alive afterwards
    evidence: list[RankEvidence]

    @property
    def how_it_ended(self) -> str:
        """How the launch ended, in a line that does not depend on which rank went first."""
        if "did not finish within" in self.ended:
            return "the launcher's timeout ended it: every rank was killed"
        if "failed (exit code" in self.ended:
            return ("the ranks' watchdogs took them down (exit code 1), and torchrun ended "
                    "whatever was left")
        return self.ended

    @property
    def all_named(self) -> bool:
        return all(o.named for o in self.outcomes)

    @property
    def clean(self) -> bool:
        """No process of the launch outlived it."""
        return not self.left_running

    def outcome(self, drill: str) -> DrillOutcome:
        """The outcome of ``drill``; a ValueError naming the drills run otherwise."""
        for o in self.outcomes:
            if o.drill == drill:
                return o
        raise ValueError(f"drill {drill!r} was not run; valid: "
                         f"{', '.join(o.drill for o in self.outcomes)}")


@dataclass(frozen=True)
class BucketSpan(Record):
    """One DDP bucket's all-reduce, as the communication hook timed it (perf_counter ns)."""

    index: int
    nbytes: int
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class DDPTrace(Record):
    """One rank's profiled DDP step: its trace file and the hook's buckets."""

    setting: str  # "overlap" or "one_bucket"
    bucket_cap_mb: float
    path: str
    buckets: list[BucketSpan]

    @property
    def hook_overlapped_ms(self) -> float:
        """A variant of lesson 06's hook measure: time some bucket's all-reduce was under
        way before the last bucket started (until then the backward was still computing:
        its last gradient starts the last bucket), taken on the union of the buckets'
        spans. Buckets queue behind each other, so their spans overlap; lesson 06 sums
        them over buckets and clips them to the backward, which counts queued time more
        than once."""
        last = max(b.start_ns for b in self.buckets)
        return length(clip([(b.start_ns, b.end_ns) for b in self.buckets],
                           (min(b.start_ns for b in self.buckets), last))) / 1e6

    @property
    def hook_comm_ms(self) -> float:
        """Time some bucket's all-reduce was under way (the union of the hook's spans)."""
        return length([(b.start_ns, b.end_ns) for b in self.buckets]) / 1e6


@dataclass(frozen=True)
class PipelineTrace(Record):
    """One rank's profiled GPipe step: its trace and its idle share from its actions."""

    path: str
    action_idle: float  # 1 - computing / step, from lesson 04's recorded actions
    microbatches: int


@dataclass(frozen=True)
class PlanCounts(Record):
    """``CommDebugMode``'s counts of one tensor-parallel training step."""

    sequence_parallel: bool
    total: dict[str, int]  # collective -> calls
    per_module: dict[str, dict[str, int]]  # module FQN -> collective -> calls


@dataclass(frozen=True)
class TraceRunResult(Record):
    """Every rank's traces and what the lesson compares them with."""

    model: LMConfig
    batch: int
    seq: int
    ddp_overlap: list[DDPTrace]  # one per rank
    ddp_one_bucket: list[DDPTrace]
    pipeline: list[PipelineTrace]
    plans: list[PlanCounts]  # without, then with sequence parallelism
    device: str
