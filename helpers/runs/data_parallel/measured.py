"""The typed pieces of lesson 06's result: DDP's timeline and the cost of its overlap,
FSDP2's tracked memory, a sharded parameter."""

from __future__ import annotations

from dataclasses import dataclass, fields

from helpers.core.timing import Timing
from helpers.runs.contract import Record


@dataclass(frozen=True)
class TrackedMemory(Record):
    """``FSDPMemTracker``'s own peak per category on rank 0 (bytes), for one FSDP2 step."""

    sharded_params: int = 0
    unsharded_params: int = 0
    sharded_grads: int = 0
    unsharded_grads: int = 0
    activations: int = 0
    temp: int = 0
    all_gather: int = 0
    reduce_scatter: int = 0
    optimizer_state: int = 0
    inputs: int = 0
    buffers: int = 0

    @classmethod
    def of(cls, peaks: dict[str, int]) -> TrackedMemory:
        """The tracker's own peaks, its categories that are not fields here left out."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in peaks.items() if k in known})


@dataclass(frozen=True)
class ShardedParameter(Record):
    """One parameter as FSDP2 holds it on rank 0."""

    name: str
    type: str
    placements: list[str]
    local_shape: list[int]
    global_shape: list[int]
    dtype: str

    def line(self) -> str:
        """What FSDP2 made of the parameter, in two lines."""
        return (f"{self.name}: a {self.type} with placements {self.placements}, {self.dtype};"
                f"\n  rank 0 holds {self.local_shape} of {self.global_shape}")


@dataclass(frozen=True)
class BucketSpan(Record):
    """One DDP bucket of the timed step: its parameters, bytes and all-reduce times (ns
    from the step's start)."""

    index: int
    nbytes: int
    params: list[str]
    param_bytes: list[int]  # each parameter's bytes, in the bucket's order
    start_ns: int
    end_ns: int

    def closes_at(self, cap: int) -> bool:
        """DDP's rule (``compute_bucket_assignment_by_size`` in reducer.cpp): a bucket is
        closed by the parameter that brings it to ``cap`` bytes or past it, so without
        its last parameter it is below the cap, and with it at or above."""
        return sum(self.param_bytes[:-1]) < cap <= self.nbytes


@dataclass(frozen=True)
class Timeline(Record):
    """DDP's last timed step on rank 0: the backward, and each bucket's all-reduce."""

    backward_start_ns: int
    compute_end_ns: int  # the last gradient written
    backward_end_ns: int  # backward() returned: every all-reduce done
    buckets: list[BucketSpan]

    @property
    def comm_s(self) -> float:
        """All-reduce time summed over the buckets (each from its start to its end)."""
        return sum(b.end_ns - b.start_ns for b in self.buckets) / 1e9

    @property
    def overlapped_s(self) -> float:
        """All-reduce time spent while the backward was still computing."""
        return sum(max(0, min(b.end_ns, self.compute_end_ns) - max(b.start_ns,
                   self.backward_start_ns)) for b in self.buckets) / 1e9

    @property
    def exposed_s(self) -> float:
        """What the backward waited for communication after its last gradient."""
        return (self.backward_end_ns - self.compute_end_ns) / 1e9


@dataclass(frozen=True)
class OverlapCost(Record):
    """DDP's backward computing time (its start to the last gradient, seconds per timed
    step) with its all-reduces running beside it, and with a hook that skips them."""

    with_comm_s: list[float]
    without_comm_s: list[float]

    def timings(self) -> tuple[Timing, Timing]:
        """(with the all-reduces, without), as timings."""
        return (Timing("backward compute, all-reduces beside it", self.with_comm_s),
                Timing("backward compute, all-reduces skipped", self.without_comm_s))

    @property
    def slowdown(self) -> float:
        """Median with the all-reduces over median without them."""
        with_comm, without = self.timings()
        return with_comm.median / without.median
