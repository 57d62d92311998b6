"""Computation against communication on one rank, from its events' intervals.

Four states split a rank's window: computing only, communicating only, both at once
(communication hidden behind computation), and neither (idle: waiting, or outside the
work). The *overlap share* is the part of the communication time that ran while the rank
was also computing: ``both / (both + communicating only)``. Holistic Trace Analysis
computes the same share on a GPU's kernel streams; here the computing events are the
main thread's operators and the communicating events the backend's collectives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from helpers.debugging.intervals import Interval, clip, intersect, length, subtract, union


@dataclass(frozen=True)
class Breakdown:
    """One rank's window split into the four states (microseconds)."""

    window: float
    computing_only: float
    communicating_only: float
    both: float
    idle: float

    @property
    def overlap_share(self) -> float:
        """Communication time spent while computing, over all communication time (0 when
        there was none)."""
        total = self.communicating_total
        return self.both / total if total else 0.0

    @property
    def communicating_total(self) -> float:
        """Time communicating, alone or beside computation."""
        return self.both + self.communicating_only

    @property
    def computing_share(self) -> float:
        """Time computing (alone or beside communication) over the window."""
        return (self.computing_only + self.both) / self.window if self.window else 0.0

    @property
    def idle_share(self) -> float:
        """Time doing neither over the window."""
        return self.idle / self.window if self.window else 0.0

    def shares(self) -> dict[str, float]:
        """Each state's share of the window, by name."""
        w = self.window or 1.0
        return {"computing only": self.computing_only / w,
                "communicating only": self.communicating_only / w,
                "both": self.both / w, "idle": self.idle / w}


def breakdown(computing: Sequence[Interval], communicating: Sequence[Interval],
              window: Interval | None = None) -> Breakdown:
    """The four states of one rank, within ``window`` (default: first to last event)."""
    everything = union([*computing, *communicating])
    if window is None:
        if not everything:
            raise ValueError("no events and no window: valid: at least one interval, or a "
                             "window")
        window = (everything[0][0], everything[-1][1])
    if window[1] < window[0]:
        raise ValueError(f"window {window} ends before it starts; valid: start <= end")
    compute, comm = clip(computing, window), clip(communicating, window)
    both = length(intersect(compute, comm))
    busy = length(union([*compute, *comm]))
    return Breakdown(window=window[1] - window[0],
                     computing_only=length(subtract(compute, comm)),
                     communicating_only=length(subtract(comm, compute)),
                     both=both, idle=(window[1] - window[0]) - busy)


@dataclass(frozen=True)
class KnownCase:
    """A constructed rank with a known overlap share, to test :func:`breakdown` on."""

    name: str
    computing: tuple[Interval, ...]
    communicating: tuple[Interval, ...]
    overlap_share: float


KNOWN_CASES = (
    # the all-reduce starts after the last operator: nothing hidden (DDP with one bucket)
    KnownCase("after the backward", ((0, 40), (40, 100)), ((100, 140),), 0.0),
    # half of the 40 us all-reduce runs under the backward's last 20 us
    KnownCase("half hidden", ((0, 60), (50, 80)), ((60, 100),), 0.5),
    # every byte sent while computing, the operators nested and overlapping
    KnownCase("all hidden", ((0, 100), (10, 20), (30, 90)), ((20, 50), (45, 80)), 1.0),
)
