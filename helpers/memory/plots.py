"""Charts of ledgers: stacked bars of weights, grads, optimizer state and activations."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from helpers.core.plotting import save_figure
from helpers.memory.ledger import KINDS, DeviceMemory

LABELS = {"weights": "weights", "grads": "gradients", "optimizer_state": "optimizer state",
          "activations": "activations (saved for backward)"}
UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def memory_bars(
    panels: dict[str, dict[str, DeviceMemory]],
    path: str | Path,
    *,
    unit: str = "MiB",
    limit: tuple[str, int] | None = None,
    cap: float | None = None,
    title: str | None = None,
) -> Path:
    """One panel per entry, one stacked bar per device; ``limit`` = (label, bytes) draws a line.

    ``cap`` (in ``unit``) cuts the y axis there; a taller bar is marked with its total.
    """
    if unit not in UNITS or not panels or not all(panels.values()):
        raise ValueError(f"unit {unit!r} (valid: {', '.join(UNITS)}) and non-empty panels needed")
    # 7.5 inches at most: the saved PNG stays within a notebook's output area (950 px)
    fig, axes = plt.subplots(1, len(panels), figsize=(min(7.5, 3.4 * len(panels) + 0.7), 4.2),
                             squeeze=False)
    # one legend entry per kind that some bar holds (plain SGD has no optimizer state)
    kinds = [k for k in KINDS if any(getattr(m, k) for bars in panels.values()
                                     for m in bars.values())]
    for ax, (name, bars) in zip(axes[0], panels.items(), strict=True):
        bottom = np.zeros(len(bars))
        for kind in kinds:
            values = np.array([getattr(m, kind) for m in bars.values()]) / UNITS[unit]
            ax.bar(list(bars), values, 0.6, bottom=bottom, label=LABELS[kind],
                   color=f"C{KINDS.index(kind)}")  # a kind keeps its colour in every chart
            bottom += values
        if cap:
            ax.set_ylim(0, cap)
            for x, total in enumerate(bottom):
                if total > cap:
                    ax.annotate(f"{total:,.0f} {unit}", (x, cap), xytext=(0, -12),
                                textcoords="offset points", ha="center", fontsize=8,
                                bbox={"boxstyle": "round", "fc": "white"})
        if limit:
            ax.axhline(limit[1] / UNITS[unit], color="red", linestyle="--", label=limit[0])
        ax.set_title(name, fontsize=10)
        ax.set_ylabel(f"bytes per device ({unit})")
        ax.yaxis.grid(True)
        ax.set_axisbelow(True)
        ax.tick_params(axis="x", labelrotation=20 if len(bars) > 2 else 0, labelsize=8)
    handles, labels = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), fontsize=8,
               bbox_to_anchor=(0.5, -0.02))
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.08 if len(labels) > 3 else 0.06, 1, 1))
    return save_figure(fig, path)
