"""The lesson's pictures: what a rank's time is made of, and every rank on one timeline."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt

from helpers.core.drawing import GREY, LIGHT, Diagram, rank_colour
from helpers.core.plotting import save_figure
from helpers.debugging.intervals import Interval, intersect, union
from helpers.debugging.overlap import KnownCase, breakdown
from helpers.debugging.trace import Activity

COMM = "#D55E00"  # communication's colour in every timeline of the lesson


def states_diagram(cases: Sequence[KnownCase]) -> Diagram:
    """Each case as a rank: its computing and communicating rows, the time they overlap
    marked, and the overlap share computed from the intervals."""
    end = max(e for c in cases for s, e in (*c.computing, *c.communicating))
    scale = 9.0 / end
    d = Diagram(11.0, 1.6 * len(cases) + 0.8,
                "Only communication that runs beside computation is hidden:\n"
                "the overlap share is that time over all communication time")
    for row, case in enumerate(cases):
        y = 1.6 * (len(cases) - 1 - row) + 0.9
        d.text(0.95, y + 0.55, f"rank {row}", align="right", bold=True)
        for s, e in union(case.computing):
            d.box(1.1 + s * scale, y + 0.35, (e - s) * scale, 0.4, "computing" if e - s > end / 6
                  else "", colour=rank_colour(row), text_colour="white", fontsize=8)
        for s, e in union(case.communicating):
            d.box(1.1 + s * scale, y - 0.15, (e - s) * scale, 0.4, "all-reduce", colour=COMM,
                  text_colour="white", fontsize=8)
        for s, e in intersect(case.computing, case.communicating):
            d.box(1.1 + s * scale, y - 0.2, (e - s) * scale, 1.0, colour=LIGHT, dashed=True,
                  alpha=0.35)
        share = breakdown(case.computing, case.communicating).overlap_share
        d.text(10.3, y + 0.3, f"{share:.0%} hidden", fontsize=9)
    d.text(1.1 + end * scale / 2, 0.25, f"time (us), 0 to {end:g}; dashed: both at once",
           colour=GREY, fontsize=8)
    return d


def timeline_figure(activities: Sequence[Activity], title: str, path: str | Path,
                    windows: Sequence[Interval] | None = None) -> Path:
    """Every rank a row on one clock (milliseconds): computing in the rank's colour, the
    backend's collectives below it; written as PNG, returns its path."""
    fig, ax = plt.subplots(figsize=(7.4, 1.4 + 0.8 * len(activities)))
    origin = min(s for a in activities for s, _ in (*a.computing, *a.communicating))
    for row, act in enumerate(activities):
        y = len(activities) - 1 - row
        ax.broken_barh([((s - origin) / 1e3, (e - s) / 1e3) for s, e in union(act.computing)],
                       (y + 0.42, 0.36), color=rank_colour(act.rank))
        ax.broken_barh([((s - origin) / 1e3, (e - s) / 1e3)
                        for s, e in union(act.communicating)], (y + 0.02, 0.36), color=COMM)
        if windows is not None:
            s, e = windows[row]
            ax.axvline((s - origin) / 1e3, color=GREY, linewidth=0.6, linestyle=":")
            ax.axvline((e - origin) / 1e3, color=GREY, linewidth=0.6, linestyle=":")
    ax.set_yticks([len(activities) - 1 - r + 0.4 for r in range(len(activities))],
                  [f"rank {a.rank}" for a in activities])
    ax.set_xlabel("time since the first event (ms)")
    ax.set_title(title, fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=rank_colour(0)),
               plt.Rectangle((0, 0), 1, 1, color=COMM)]
    ax.legend(handles, ["computing (main thread's operators)", "communicating (gloo's)"],
              loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, fontsize=8)
    return save_figure(fig, path)
