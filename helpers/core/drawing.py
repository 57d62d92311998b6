"""Drawn diagrams: boxes, arrows and labels on a blank canvas, shown as one PNG.

Each technique package draws its own pictures (``helpers/<technique>/diagrams.py``) from
the same objects the lesson runs (a mesh, a schedule, a shard plan), so a picture cannot
drift from the code. This module only holds the pen: a ``Diagram`` that a notebook cell
displays as a PNG no wider than the output area, one colour per rank, and a few shapes.
Coordinates are in the canvas's own units: x from 0 to ``width``, y from 0 to ``height``,
y upwards.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg", force=False)
from matplotlib.figure import Figure  # noqa: E402 (after choosing the backend)
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

from helpers.core.files import atomic_write_bytes  # noqa: E402

DPI = 100
MAX_WIDTH_IN = 9.4  # 940 px at DPI: the output area's width (see tests/course_tools)
# One colour per rank, colour-blind safe (Okabe and Ito), then greys
RANK_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00",
                "#F0E442", "#000000")
GREY, LIGHT, INK = "#9E9E9E", "#EEEEEE", "#222222"


def rank_colour(rank: int) -> str:
    """The colour of ``rank`` in every diagram of the course."""
    if rank < 0:
        raise ValueError(f"rank must be >= 0, got {rank}")
    return RANK_COLOURS[rank % len(RANK_COLOURS)]


class Diagram:
    """A drawing canvas whose title states the picture's takeaway.

    ``Diagram(width, height, title)`` gives an empty canvas ``width`` x ``height`` units;
    draw with ``box``, ``arrow`` and ``text``; a notebook shows it as PNG
    (``_repr_png_``); ``save`` writes the same PNG.
    """

    def __init__(self, width: float, height: float, title: str, *, scale: float = 0.9) -> None:
        if width <= 0 or height <= 0:
            raise ValueError(f"a diagram needs a positive size, got {width} x {height}")
        if not title.strip():
            raise ValueError("a diagram's title states its takeaway; got an empty title")
        inches = min(MAX_WIDTH_IN, width * scale)
        lines = title.count("\n") + 1
        top = 0.2 + 0.2 * lines  # inches kept for the title
        tall = inches * height / width + top
        self.width, self.height, self.title = width, height, title
        self.labels: list[str] = []  # every label drawn, in order: what a test can read
        self.boxes: list[tuple[float, float, float, float, str]] = []  # x, y, w, h, colour
        self.arrows = 0
        self.figure = Figure(figsize=(inches, tall), dpi=DPI)
        self.ax = self.figure.add_axes((0.0, 0.0, 1.0, (tall - top) / tall))
        self.ax.set_xlim(0, width)
        self.ax.set_ylim(0, height)
        self.ax.set_aspect("equal")
        self.ax.axis("off")
        self.figure.suptitle(title, fontsize=11, y=0.995, va="top")

    def box(self, x: float, y: float, w: float, h: float, label: str = "", *,
            colour: str = LIGHT, edge: str = INK, text_colour: str = INK,
            fontsize: float = 9, dashed: bool = False, alpha: float = 1.0) -> Diagram:
        """A rounded box with its lower-left corner at (x, y) and ``label`` in its middle."""
        self.boxes.append((x, y, w, h, colour))
        self.ax.add_patch(FancyBboxPatch(
            (x, y), w, h, boxstyle="round,pad=0,rounding_size=0.06", facecolor=colour,
            edgecolor=edge, linewidth=1.0, linestyle="--" if dashed else "-", alpha=alpha))
        if label:
            self.text(x + w / 2, y + h / 2, label, colour=text_colour, fontsize=fontsize)
        return self

    def arrow(self, start: tuple[float, float], end: tuple[float, float], label: str = "", *,
              colour: str = INK, bend: float = 0.0, fontsize: float = 8,
              dashed: bool = False) -> Diagram:
        """An arrow from ``start`` to ``end``, ``label`` beside its middle; ``bend`` curves it."""
        self.ax.add_patch(FancyArrowPatch(
            start, end, arrowstyle="-|>", mutation_scale=10, color=colour, linewidth=1.2,
            connectionstyle=f"arc3,rad={bend}", linestyle="--" if dashed else "-",
            shrinkA=2, shrinkB=2))
        self.arrows += 1
        if label:
            mid_x, mid_y = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
            self.text(mid_x, mid_y + 0.12, label, colour=colour, fontsize=fontsize)
        return self

    def text(self, x: float, y: float, label: str, *, colour: str = INK, fontsize: float = 9,
             align: str = "center", bold: bool = False) -> Diagram:
        """``label`` centred (or ``align``-ed: left, right) on (x, y)."""
        self.labels.append(label)
        self.ax.text(x, y, label, ha=align, va="center", color=colour, fontsize=fontsize,
                     fontweight="bold" if bold else "normal")
        return self

    def png(self) -> bytes:
        """The diagram as PNG bytes."""
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=DPI, facecolor="white")
        return buffer.getvalue()

    def _repr_png_(self) -> bytes:
        return self.png()

    def save(self, path: str | Path) -> Path:
        """Write the PNG atomically; returns the path."""
        return atomic_write_bytes(path, self.png())

    def __repr__(self) -> str:
        return f"<diagram: {self.title}>"
