"""The pipelined speed-up, measured like for like, set against its ideal.

Lesson 03's baseline is one process running the whole model with one thread, timed in a
stage process (``PipelineResult.single``): the ideal K·M/(M+K-1) then also assumes stages
of equal cost and free sends. ``make bench`` also times the same K stage processes running
the same batch as one micro-batch
(M = 1): the same work, the same sends at the cuts, timed the same way, with nothing to
overlap. What changes between that baseline and a run with M micro-batches is the overlap
and the size of each micro-batch, so the ideal speed-up is GPipe's K·M/(M+K-1) (the M = 1
step is K stage times, the M-micro-batch step M+K-1 times 1/M of one). That ideal assumes
a micro-batch of B/M samples costs exactly 1/M of the whole batch; when smaller micro-batches are cheaper per
sample on the device (or the baseline was slowed by other work on the machine), a
measured speed-up can exceed it, and ``describe`` says so instead of printing it bare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from helpers.core.timing import Timing
from helpers.pipeline.schedule import ideal_speedup


@dataclass(frozen=True)
class Speedup:
    """A pipelined run's step time against the same processes at M = 1."""

    stages: int
    microbatches: int
    run: Timing
    baseline: Timing
    against: str = ""  # what the baseline is (default: the same processes at M = 1)

    @property
    def value(self) -> float:
        return self.baseline.mean / self.run.mean

    @property
    def ideal(self) -> float:
        return ideal_speedup(self.stages, self.microbatches)

    @property
    def spread(self) -> float:
        """One standard deviation of ``value``, from the two runs' relative spreads."""
        rel = math.hypot(self.baseline.std / self.baseline.mean, self.run.std / self.run.mean)
        return self.value * rel

    @property
    def above_ideal(self) -> bool:
        return self.value > self.ideal

    def describe(self) -> str:
        """One line, and a second one whenever the measurement exceeds the ideal."""
        against = self.against or f"the same {self.stages} processes at M=1"
        line = (f"M={self.microbatches}: {self.value:.2f}x +- {self.spread:.2f} over {against} "
                f"(ideal {self.ideal:.2f}x, {self.value / self.ideal:.0%} of it)")
        if self.above_ideal:
            within = "within" if self.value - self.spread <= self.ideal else "beyond"
            line += (f"\n  above the ideal ({within} one spread): the ideal assumes a "
                     f"micro-batch of 1/{self.microbatches} of the batch\n  costs 1/"
                     f"{self.microbatches} of its time; smaller micro-batches that run "
                     "cheaper per sample,\n  or other work slowing the baseline, break that")
        return line


def speedups(timed: dict[tuple[str, int], Timing], stages: int,
             schedule: str = "gpipe") -> list[Speedup]:
    """Every timed ``schedule`` run against the same launch's ``schedule`` run at M = 1."""
    if (schedule, 1) not in timed:
        raise ValueError(f"no {schedule} run at M=1 to compare with; timed runs: {sorted(timed)}")
    baseline = timed[(schedule, 1)]
    return [Speedup(stages, m, t, baseline)
            for (s, m), t in sorted(timed.items()) if s == schedule and m != 1]


def speedup_over_one_process(run: Timing, single: Timing, stages: int,
                             microbatches: int) -> Speedup:
    """A pipelined run against one process running the whole model (one thread, on a CPU)."""
    return Speedup(stages, microbatches, run, single, against="one process")
