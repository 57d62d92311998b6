"""Timelines of pipeline schedules: the measured one, and the same order at ideal costs.

``ideal_timeline`` (``helpers.pipeline.diagrams``) replays each rank's recorded order of
actions with unit costs per chunk (forward 1, full backward 2, input-gradient 1,
weight-gradient 1, divided by the chunks per rank) and free communication, honouring the
pipeline's dependencies: the tick diagram of the schedule, drawn under what really happened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import matplotlib.pyplot as plt

from helpers.core.plotting import save_figure
from helpers.pipeline.diagrams import ideal_timeline  # noqa: F401 (its callers import it here)
from helpers.pipeline.events import COMPUTE
from helpers.runs.schedules.transfers import HEADERS_PER_RECEIVE, HEADERS_PER_SEND, RankTransfers


class Recorded(Protocol):
    """What the charts read of one schedule's run (``results.ScheduleRun``)."""

    actions: list[dict]
    start_ns: int
    memory_actions: list[dict]
    memory_start_ns: int

    @property
    def ideal(self) -> list[dict]: ...


class Transferred(Protocol):
    """What the transfers table reads of one schedule's run (``results.ScheduleRun``)."""

    transfers: list[RankTransfers]
    wire_reason: str | None


def transfers_table(runs: Mapping[str, Transferred], ok: bool) -> str:
    """Per schedule and rank: sends, receives, the tensors' bytes, the wire's, and whether
    the difference is gloo's headers exactly (✓) or what they allow; ``ok``: the verdict."""
    headers = f"= {HEADERS_PER_SEND}·s + {HEADERS_PER_RECEIVE}·r"
    lines = [f"{'schedule':<17}{'rank':>5}{'sends s':>9}{'recvs r':>9}{'tensors (B)':>12}"
             f"{'on the wire (B)':>17}{'wire - tensors':>15}  {headers}"]
    for name, run in runs.items():
        for r, t in enumerate(run.transfers):
            wire, extra, same = "-", "-", ""
            if t.wire_sent is not None:
                wire, extra = f"{t.wire_sent:,}", f"{t.wire_sent - t.sent_bytes:,}"
                same = "✓" if t.wire_sent - t.sent_bytes == t.headers else f"≠ {t.headers:,}"
            lines.append(f"{name:<17}{r:>5}{t.sends:>9}{t.receives:>9}{t.sent_bytes:>12,}"
                         f"{wire:>17}{extra:>15}  {same}")
    reasons = {run.wire_reason for run in runs.values()} - {None}
    lines += [f"wire not read: {reason}" for reason in sorted(reasons)]
    lines.append(f"every rank: sends, receives, tensor bytes as planned; wire within "
                 f"[tensors, tensors + headers]  {'OK' if ok else 'FAILED'}")
    return "\n".join(lines)


class Split(Protocol):
    """What the cost split reads of one schedule's run (``results.ScheduleRun``)."""

    ranks: int
    bubble_theory: float
    free_communication_idle_fraction: float
    idle_fraction: list[float]

    def seconds(self, kind: str) -> list[float]: ...


def cost_split_report(name: str, run: Split) -> str:
    """Where a zero-bubble schedule's idle time comes from: its measured I/F and W/F per
    rank, then its idle share three ways (the formula with I = W = F, the same order
    replayed with the measured costs and free sends, and measured)."""
    f, i, w = run.seconds("F"), run.seconds("I"), run.seconds("W")
    lines = [f"{name}, rank {r}: I/F = {i[r] / f[r]:.2f}, W/F = {w[r] / f[r]:.2f} "
             "(the formula assumes 1 and 1)" for r in range(run.ranks)]
    lines += [f"idle share: {run.bubble_theory:.1%} with I = W = F (formula and replay)",
              f"            {run.free_communication_idle_fraction:.1%} replaying the same "
              "order with this run's measured costs, sending free",
              "            " + " ".join(f"{x:.0%}" for x in run.idle_fraction)
              + " measured, per rank"]
    return "\n".join(lines)


COLOURS = {"F": "#4c72b0", "B": "#dd8452", "I": "#e8a87c", "W": "#55a868", "wait": "#bbbbbb"}
NAMES = {"F": "forward", "B": "backward", "I": "backward, input gradient",
         "W": "backward, weight gradient", "wait": "waiting for a send or receive to complete"}
def _draw(ax: plt.Axes, rows: Sequence[dict], ranks: int, scale: float, offset: float) -> None:
    for a in rows:
        start, end = (a["start"] - offset) * scale, (a["end"] - offset) * scale
        height = 0.35 if a["kind"] == "wait" else 0.8
        ax.barh(a["rank"], end - start, left=start, height=height, color=COLOURS[a["kind"]],
                edgecolor="white" if a["kind"] != "wait" else "none", linewidth=0.5)
        if a["kind"] != "wait" and end - start > 0:
            ax.text((start + end) / 2, a["rank"], str(a["microbatch"]), ha="center",
                    va="center", fontsize=6, color="white", clip_on=True)
    ax.set_xlim(left=0)
    ax.set_yticks(range(ranks))
    ax.set_yticklabels([f"rank {r}" for r in range(ranks)])
    ax.invert_yaxis()
    ax.xaxis.grid(True, alpha=0.4)
    ax.set_axisbelow(True)


def timeline_chart(runs: dict[str, Recorded], ranks: int, path: str | Path, *,
                   title: str = "") -> Path:
    """Per schedule: the measured timeline (ms) above its ideal tick diagram (unit costs);
    ``title``: what this run's figure shows (default: how to read it).

    7.5 inches wide (900 pixels as saved): JupyterLab shows it at its own size.
    """
    fig, axes = plt.subplots(2 * len(runs), 1, figsize=(7.5, 0.55 * ranks * 2 * len(runs) + 1.6))
    for i, (name, run) in enumerate(runs.items()):
        measured = [{**a, "start": a["start_ns"], "end": a["end_ns"]} for a in run.actions]
        _draw(axes[2 * i], measured, ranks, 1e-6, run.start_ns)
        axes[2 * i].set_title(f"{name}: measured (ms since the step began)", fontsize=9,
                              loc="left")
        _draw(axes[2 * i + 1], run.ideal, ranks, 1.0, 0.0)
        axes[2 * i + 1].set_title(f"{name}: same order at ideal costs (ticks: a forward = 1 per "
                                  "stage, sending free)", fontsize=9, loc="left")
    for ax in axes:
        ax.tick_params(labelsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in COLOURS]
    fig.legend(handles, [NAMES[k] for k in COLOURS], loc="lower center", ncol=2, fontsize=8,
               frameon=False)
    default = ("The same order of work, measured (ms) and at ideal costs (ticks): where they\n"
               "differ, a rank waited (grey) or an action cost more or less than its ticks")
    fig.suptitle(title or default, fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return save_figure(fig, path)


def memory_chart(runs: dict[str, Recorded], ranks: int, path: str | Path, *,
                 title: str = "") -> Path:
    """Per schedule: activation bytes held for backward on each rank over the metered step
    (MiB), two panels a row, 7.5 inches wide; ``title``: what the figure shows."""
    rows = (len(runs) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(7.5, 2.3 * rows + 0.9), sharey=True,
                             squeeze=False)
    for ax, (name, run) in zip(axes.flat, runs.items(), strict=False):
        for r in range(ranks):
            points = sorted((a["end_ns"], a["live_bytes"]) for a in run.memory_actions
                            if a["rank"] == r and a["kind"] in COMPUTE)
            xs = [0.0] + [(t - run.memory_start_ns) / 1e6 for t, _ in points]
            ys = [0.0] + [b / 2**20 for _, b in points]
            ax.step(xs, ys, where="post", label=f"rank {r}")
        ax.set_title(name, fontsize=9)
        ax.yaxis.grid(True, alpha=0.4)
        ax.tick_params(labelsize=8)
    for ax in axes.flat[len(runs):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("ms since the metered step began", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("held for backward (MiB)", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=ranks, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return save_figure(fig, path)
