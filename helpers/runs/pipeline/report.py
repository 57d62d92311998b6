"""Lesson 03's chart: step time against the number of micro-batches, with the ideal."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from helpers.core.plotting import save_figure
from helpers.core.timing import Timing
from helpers.pipeline.schedule import ideal_speedup


def split_size_chart(
    single: Timing,
    runs: dict[tuple[str, int], Timing],
    stages: int,
    path: str | Path,
    *,
    title: str = "",
) -> Path:
    """Measured pipelined step time per M (mean +- std) beside the ideal: the same processes'
    M = 1 time divided by K·M/(M+K-1); ``single`` (one process) drawn as a reference line."""
    if ("gpipe", 1) not in runs:
        raise ValueError(f"the ideal needs the GPipe run at M=1; timed runs: {sorted(runs)}")
    base = runs[("gpipe", 1)]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for schedule, name, marker in (("gpipe", "GPipe", "o"), ("1f1b", "1F1B", "s")):
        points = sorted((m, t) for (s, m), t in runs.items() if s == schedule)
        if points:
            ax.errorbar(
                [m for m, _ in points],
                [t.mean for _, t in points],
                yerr=[t.std for _, t in points],
                marker=marker,
                capsize=4,
                label=f"measured, {name} ({stages} processes)",
            )
    counts = sorted({m for _, m in runs})
    ax.plot(
        counts,
        [base.mean / ideal_speedup(stages, m) for m in counts],
        "k--",
        label="ideal: (M=1 time) / (K·M/(M+K-1))",
    )
    ax.axhline(single.mean, color="gray", linestyle=":", label=single.label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(m) for m in counts])
    ax.set_xlabel("micro-batches per batch (M)")
    ax.set_ylabel("training step time (s)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.4)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return save_figure(fig, path)
