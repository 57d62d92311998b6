"""Timing that a learner can trust: warm-up excluded, repeats, mean +- std, median.

Each repeat is timed with the clock of ``torch.utils.benchmark``, which synchronises
the accelerator (CUDA) before reading ``time.perf_counter``, so asynchronous GPU work is
counted in full. We do not use ``benchmark.Timer.timeit`` itself: it runs each statement
twice more as its own warm-up and pins torch to one thread unless told otherwise, which
would triple the cost of a training step and change what is measured.
"""

from __future__ import annotations

import logging
import os
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

# torch.utils.benchmark imports the C++ extension builder, which warns about a missing
# CUDA toolkit on machines without one; nothing here compiles, so the warning is noise.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
from torch.utils.benchmark.utils.timer import timer as synchronized_clock  # noqa: E402

# ``make run``, ``make refresh`` and the tests set this to "final": no live progress bar, whose
# redraws would be stored in the notebook as stderr fragments; the timing printed after the
# loop (mean, std, n) is what the reader keeps.
PROGRESS_ENV = "TUTORIAL_PROGRESS"


@dataclass(frozen=True)
class Timing:
    """Seconds per run over ``len(times)`` timed repeats."""

    label: str
    times: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times)

    @property
    def std(self) -> float:
        """Sample standard deviation (0 for a single repeat)."""
        return statistics.stdev(self.times) if len(self.times) > 1 else 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def max(self) -> float:
        return max(self.times)

    def as_dict(self) -> dict:
        """The times and their statistics, as JSON results carry them."""
        return {
            "times_s": list(self.times),
            "mean_s": self.mean,
            "std_s": self.std,
            "min_s": self.min,
            "max_s": self.max,
        }

    def __str__(self) -> str:
        return (
            f"{self.label}: {self.mean:.4f} s +- {self.std:.4f} s "
            f"(median {self.median:.4f} s, n={len(self.times)})"
        )


class RepeatsInMs:
    """``mean_ms`` and ``std_ms`` of a record's ``seconds`` (one per timed repeat; NaN and 0
    when there are none), for a record class to inherit."""

    seconds: list[float]

    @property
    def mean_ms(self) -> float:
        return 1e3 * statistics.fmean(self.seconds) if self.seconds else float("nan")

    @property
    def std_ms(self) -> float:
        return 1e3 * statistics.stdev(self.seconds) if len(self.seconds) > 1 else 0.0


def _rounds(repeats: int, warmup: int, desc: str, unit: str, progress: bool) -> Iterable[int]:
    """The timed repeats (with a live bar when asked and not in a stored run); bad counts refused."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats!r}; valid: an integer >= 1")
    if warmup < 0:
        raise ValueError(f"warmup={warmup!r}; valid: an integer >= 0")
    if progress and os.environ.get(PROGRESS_ENV) != "final":
        from tqdm import tqdm  # plain text bar: works in a terminal, a notebook and a log

        return tqdm(range(repeats), desc=desc, unit=unit, mininterval=0.5)
    return range(repeats)


def measure(
    fn: Callable[[], object],
    *,
    repeats: int,
    warmup: int = 1,
    label: str = "",
    progress: bool = False,
) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then time ``repeats`` runs one by one."""
    runs = _rounds(repeats, warmup, label or "timing", "run", progress)
    for _ in range(warmup):
        fn()
    times = []
    for _ in runs:
        start = synchronized_clock()
        fn()
        times.append(synchronized_clock() - start)
    return Timing(label=label, times=times)


def measure_alternating(
    fns: dict[str, Callable[[], object]], *, repeats: int, warmup: int = 1, progress: bool = False
) -> dict[str, Timing]:
    """Time several functions in turn (A B A B ...), so that a slow spell of the machine
    falls on all of them alike instead of on whichever ran during it; ``warmup`` untimed
    rounds first. One ``Timing`` per label."""
    rounds = _rounds(repeats, warmup, " / ".join(fns), "round", progress)
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {label: [] for label in fns}
    for _ in rounds:
        for label, fn in fns.items():
            start = synchronized_clock()
            fn()
            times[label].append(synchronized_clock() - start)
    return {label: Timing(label=label, times=t) for label, t in times.items()}


def within_spread(a: Timing, b: Timing) -> bool:
    """Whether the means differ by no more than the two runs' spreads together."""
    return abs(a.mean - b.mean) <= a.std + b.std


def relative_difference(candidate: Timing, reference: Timing) -> float:
    """(candidate - reference) / reference of the means: +0.07 means 7% slower."""
    return (candidate.mean - reference.mean) / reference.mean
