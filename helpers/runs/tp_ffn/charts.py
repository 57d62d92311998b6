"""Lesson 08's timing charts: legends below the bars, where no error bar can reach them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from helpers.core.plotting import save_figure
from helpers.runs.tp_ffn.results import TPRun
from helpers.runs.tp_ffn.timings import Sweep


def _legend_below(ax, columns: int) -> None:
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=columns, fontsize=9,
              frameon=False)


def timings_chart(sweep: Sweep, path: Path, *, title: str, xlabel: str) -> Path:
    """Native, ``tp_simulate`` and tensor parallel per world size: mean bars, std whiskers
    (cut at zero: a time is never negative)."""
    import matplotlib.pyplot as plt

    series = sweep.series()
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    x, width = np.arange(len(sweep.runs)), 0.8 / len(series)
    for i, (label, (means, stds)) in enumerate(series.items()):
        low = np.minimum(stds, means)
        ax.bar(x + (i - (len(series) - 1) / 2) * width, means, width, yerr=[low, stds],
               capsize=4, label=label, alpha=0.85, error_kw={"ecolor": "black"})
    ax.set_xticks(x, [f"p = {p}" for p in sweep.runs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("FFN forward (ms)")
    ax.yaxis.grid(True)
    ax.set_axisbelow(True)
    ax.set_title(title, fontsize=11)
    _legend_below(ax, len(series))
    return save_figure(fig, path)


def breakdown_chart(runs: dict[int, TPRun], path: Path, *, title: str) -> Path:
    """Rank 0's step per world size: its compute below, its all-reduce above (means)."""
    import matplotlib.pyplot as plt

    compute = [r.compute.mean * 1e3 for r in runs.values()]
    reduce = [r.allreduce.mean * 1e3 for r in runs.values()]
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    x = np.arange(len(runs))
    ax.bar(x, compute, 0.6, label="compute")
    ax.bar(x, reduce, 0.6, bottom=compute, label="all-reduce (waiting for peers included)")
    ax.set_xticks(x, [f"p = {p}" for p in runs])
    ax.set_xlabel("world size")
    ax.set_ylabel("one step on rank 0 (ms)")
    ax.yaxis.grid(True)
    ax.set_axisbelow(True)
    ax.set_title(title, fontsize=11)
    _legend_below(ax, 2)
    return save_figure(fig, path)
