"""What lesson 06's ranks sent, three ways, and the verdict on it, decided here once.

For each collective a rank issues, the bytes it sends:

- by the ring formula (:func:`~helpers.comm.collectives.ring_bytes`): what NCCL's ring sends;
- by gloo's algorithms (:func:`~helpers.comm.collectives.gloo_bytes`): what this run's
  backend sends (a reduce-scatter is an all-reduce of a copy, then a slice: twice the ring's);
- on the wire: what this rank's sockets sent (:class:`~helpers.comm.wire.WireMeter`), store
  traffic apart; None where the counters cannot be read or the backend is NCCL.

The verdict (:func:`check_traffic`) asserts what can be observed: the collectives issued,
with the size of each, equal the plan made from the model's shapes (:data:`PLANS`); and the
wire lies between gloo's prediction and that plus gloo's headers for those calls
(:func:`header_allowance`, counted from gloo's algorithms).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from helpers.comm.calls import C10D_OPS, call_bytes
from helpers.comm.collectives import gloo_bytes, ring_bytes
from helpers.comm.headers import gloo_header_bytes, wire_within
from helpers.comm.meter import CommMeter
from helpers.runs.contract import Record


def header_allowance(calls: list[Call], world_size: int, rank: int = 0) -> int:
    """Bytes of gloo's headers rank ``rank`` writes for ``calls``, counted from its
    algorithms (:func:`helpers.comm.headers.gloo_header_bytes`): derived, not chosen."""
    return sum(gloo_header_bytes(c, world_size, s, rank) for c, s in calls)


NCCL_WIRE = ("backend nccl: the collectives travel over NCCL's own transports (NVLink, PCIe, "
             "InfiniBand), not this process's TCP sockets")

Call = tuple[str, int]  # (collective, bytes of its full tensor S)


class CallLog(CommMeter):
    """A :class:`~helpers.comm.meter.CommMeter` that also lists every collective issued,
    with the bytes of its full tensor, in order (``issued``)."""

    def __init__(self) -> None:
        super().__init__()
        self.issued: list[Call] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d" and func._opname in C10D_OPS:
            collective, full = C10D_OPS[func._opname]
            self.issued.append((collective, call_bytes(args[full])))
        return super().__torch_dispatch__(func, types, args, kwargs)


@dataclass(frozen=True)
class Traffic(Record):
    """What one step sent from one rank: the calls issued, and the bytes three ways."""

    issued: list[tuple[str, int]]  # (collective, bytes of its full tensor), in order
    ring: dict[str, float]  # per collective, by the ring formula
    gloo: dict[str, float]  # per collective, by gloo's algorithms
    wire: int | None  # this rank's sockets (None: see the result's ``wire_reason``)

    @classmethod
    def of(cls, log: CallLog, wire: bool = True) -> Traffic:
        """The tallies of ``log``; its wire count left out (None) when ``wire`` is False."""
        return cls(list(log.issued), dict(log.per_collective.ring),
                   dict(log.per_collective.gloo), log.wire.sent if wire else None)

    @property
    def total_ring(self) -> float:
        return float(sum(self.ring.values()))

    @property
    def total_gloo(self) -> float:
        return float(sum(self.gloo.values()))

    def calls(self) -> Counter:
        """Calls issued per collective."""
        return Counter(c for c, _ in self.issued)


@dataclass(frozen=True)
class Plan:
    """The collectives one technique issues in a step: per piece (the whole model, each
    parameter, or each unit), ``gathers`` all-gathers of it in ``gather_scale`` of its
    float32 bytes, and one ``reduce`` of its float32 gradient."""

    pieces: str  # "model", "parameter" or "unit"
    gathers: int
    gather_scale: float
    reduce: str

    def calls(self, units: dict[str, list[int]]) -> list[Call]:
        """The calls, from each unit's parameters' float32 bytes (``units``)."""
        sizes = {"model": [sum(map(sum, units.values()))],
                 "parameter": [b for unit in units.values() for b in unit],
                 "unit": [sum(unit) for unit in units.values()]}[self.pieces]
        return ([("all_gather", int(b * self.gather_scale)) for b in sizes
                 for _ in range(self.gathers)] + [(self.reduce, b) for b in sizes])


# DDP's first step all-reduces one bucket, the whole model; the hand ZeRO works parameter
# by parameter, FSDP2 unit by unit; stages 1-2 gather the updated weights once, stage 3
# and FSDP2 gather before the forward and again before the backward (resharding), and in
# bfloat16 at half the bytes.
PLANS = {
    "DDP": Plan("model", 0, 1.0, "all_reduce"),
    "ZeRO-1": Plan("parameter", 1, 1.0, "reduce_scatter"),
    "ZeRO-2": Plan("parameter", 1, 1.0, "reduce_scatter"),
    "ZeRO-3": Plan("parameter", 2, 1.0, "reduce_scatter"),
    "ZeRO-3 bf16": Plan("parameter", 2, 0.5, "reduce_scatter"),
    "FSDP2": Plan("unit", 2, 1.0, "reduce_scatter"),
    "FSDP2 no reshard": Plan("unit", 1, 1.0, "reduce_scatter"),
    "FSDP2 bf16": Plan("unit", 2, 0.5, "reduce_scatter"),
}


def planned(run: str, units: dict[str, list[int]]) -> list[Call]:
    """The calls run ``run`` should issue in its step, from the model's shapes."""
    if run not in PLANS:
        raise ValueError(f"no plan for run {run!r}; valid: {', '.join(PLANS)}")
    return PLANS[run].calls(units)


def gloo_prediction(calls: list[Call], world_size: int, rank: int = 0) -> float:
    """Bytes rank ``rank`` sends for ``calls`` by gloo's algorithms (broadcasts from 0)."""
    return float(sum(gloo_bytes(c, world_size, s, rank) for c, s in calls))


def ring_prediction(calls: list[Call], world_size: int) -> float:
    """Bytes a rank sends for ``calls`` by the ring formula."""
    return float(sum(ring_bytes(c, world_size, s) for c, s in calls))


@dataclass(frozen=True)
class TrafficCheck:
    """One run's bytes verdict: the calls against the plan, the wire against gloo."""

    run: str
    calls_as_planned: bool
    wire: int | None
    gloo: float
    allowance: float  # gloo's headers for the calls (header_allowance), derived

    @property
    def wire_ok(self) -> bool | None:
        """gloo <= wire <= gloo + allowance; None when the wire was not read."""
        return wire_within(self.wire, self.gloo, self.allowance)

    @property
    def ok(self) -> bool:
        return self.calls_as_planned and self.wire_ok is not False

    def line(self) -> str:
        """The verdict in one line."""
        calls = "calls and sizes = plan" if self.calls_as_planned else "calls differ from the plan"
        if self.wire is None:
            wire = "wire not read"
        else:
            extra = self.wire - self.gloo
            wire = (f"wire = gloo + its headers ({extra:,.0f} B)" if extra == self.allowance
                    else f"wire - gloo = {extra:,.0f} B, within [0, {self.allowance:,.0f} B]"
                    if self.wire_ok else
                    f"wire {self.wire:,} B outside [{self.gloo:,.0f}, "
                    f"{self.gloo + self.allowance:,.0f}] B")
        return f"{self.run:<17}{calls}; {wire}  {'OK' if self.ok else 'FAILED'}"


def check_traffic(run: str, traffic: Traffic, plan: list[Call], world_size: int) -> TrafficCheck:
    """The verdict on one run's step (rank 0): the same calls of the same sizes as the
    plan (in any order), and the wire within gloo's prediction plus its headers."""
    return TrafficCheck(run, Counter(traffic.issued) == Counter(plan), traffic.wire,
                        gloo_prediction(plan, world_size),
                        header_allowance(traffic.issued, world_size))


@dataclass(frozen=True)
class CollectiveSize(Record):
    """One collective at one size: each rank's bytes three ways for one untimed call, and
    rank 0's time per call over its timed rounds."""

    collective: str
    nbytes: int  # S, the full tensor
    ring: float  # what each rank sends by the ring formula
    gloo: list[float]  # per rank, by gloo's algorithms (a broadcast's root and leaf differ)
    wire: list[int] | None  # per rank, on the wire (None: not read)
    times: list[float]  # rank 0, seconds per call, one per timed round

    @property
    def headers(self) -> list[int] | None:
        """Wire minus gloo's payload, per rank: the headers (None: the wire not read)."""
        if self.wire is None:
            return None
        return [int(w - g) for w, g in zip(self.wire, self.gloo, strict=True)]

    @property
    def wire_ok(self) -> bool | None:
        """Every rank's wire within [gloo, gloo + its headers]; None: not read."""
        if self.headers is None:
            return None
        n = len(self.headers)
        return all(0 <= h <= header_allowance([(self.collective, self.nbytes)], n, rank)
                   for rank, h in enumerate(self.headers))
