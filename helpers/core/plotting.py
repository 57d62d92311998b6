"""Charts that are always saved: a bar chart of means with std error bars."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from helpers.core.files import atomic_write_bytes


def save_figure(fig: plt.Figure, path: str | Path) -> Path:
    """Save ``fig`` as PNG atomically and close it."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
    return atomic_write_bytes(path, buffer.getvalue())


def _finish(
    fig: plt.Figure,
    ax: plt.Axes,
    path: str | Path,
    *,
    ylabel: str,
    xlabel: str = "",
    title: str | None = None,
    legend: bool = False,
) -> Path:
    """Labels, a horizontal grid behind the bars, then save (see ``save_figure``)."""
    ax.set_ylabel(ylabel)
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.yaxis.grid(True)
    ax.set_axisbelow(True)
    if legend:
        ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return save_figure(fig, path)


def bar_chart(
    means: Sequence[float],
    stds: Sequence[float],
    labels: Sequence[str],
    path: str | Path,
    *,
    ylabel: str,
    title: str | None = None,
) -> Path:
    """Bars of ``means`` with ``stds`` as error bars; saved to ``path``, which is returned."""
    if not (len(means) == len(stds) == len(labels)) or not means:
        raise ValueError(
            f"means, stds and labels must be non-empty and of one length; "
            f"got {len(means)}, {len(stds)}, {len(labels)}"
        )
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(means)), 3.6))
    x = np.arange(len(means))
    ax.bar(x, means, yerr=stds, align="center", alpha=0.6, ecolor="red", capsize=10, width=0.6)
    ax.set_xticks(x)
    ax.set_xticklabels(labels)
    return _finish(fig, ax, path, ylabel=ylabel, title=title)


def grouped_bar_chart(
    groups: Sequence[str],
    series: dict[str, tuple[Sequence[float], Sequence[float]]],
    path: str | Path,
    *,
    ylabel: str,
    xlabel: str = "",
    title: str | None = None,
) -> Path:
    """One group of bars per entry of ``groups``; ``series`` maps a label to (means, stds)."""
    if (
        not groups
        or not series
        or any(len(m) != len(groups) or len(s) != len(groups) for m, s in series.values())
    ):
        raise ValueError(f"each series needs one mean and one std per group ({len(groups)} groups)")
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(groups) * len(series) / 2 + 2), 3.8))
    x = np.arange(len(groups))
    width = 0.8 / len(series)
    for i, (label, (means, stds)) in enumerate(series.items()):
        ax.bar(
            x + (i - (len(series) - 1) / 2) * width,
            means,
            width,
            yerr=stds,
            capsize=4,
            label=label,
            alpha=0.8,
            error_kw={"ecolor": "black"},
        )
    ax.set_xticks(x)
    ax.set_xticklabels(groups)
    return _finish(fig, ax, path, ylabel=ylabel, xlabel=xlabel, title=title, legend=True)


def stacked_bar_chart(
    labels: Sequence[str],
    parts: dict[str, Sequence[float]],
    path: str | Path,
    *,
    ylabel: str,
    xlabel: str = "",
    title: str | None = None,
) -> Path:
    """Bars made of stacked ``parts`` (label -> one value per bar)."""
    if not labels or any(len(v) != len(labels) for v in parts.values()):
        raise ValueError(f"each part needs one value per bar ({len(labels)} bars)")
    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(labels) + 1.5), 3.8))
    bottom = np.zeros(len(labels))
    for name, values in parts.items():
        ax.bar(labels, values, 0.6, bottom=bottom, label=name)
        bottom += np.asarray(values, dtype=float)
    return _finish(fig, ax, path, ylabel=ylabel, xlabel=xlabel, title=title, legend=True)
