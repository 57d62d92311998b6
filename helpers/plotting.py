"""Charts that are always saved: a bar chart of means with std error bars."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np


def save_figure(fig: plt.Figure, path: str | Path) -> Path:
    """Save ``fig`` as PNG atomically (temporary file, then rename) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a figure is meant to be shared
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
        plt.close(fig)
    return path


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
    ax.set_ylabel(ylabel)
    ax.set_xticks(x)
    ax.set_xticklabels(labels)
    ax.yaxis.grid(True)
    ax.set_axisbelow(True)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return save_figure(fig, path)
