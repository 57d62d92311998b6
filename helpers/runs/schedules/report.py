"""Timelines of pipeline schedules: the measured one, and the same order at ideal costs.

``ideal_timeline`` replays each rank's recorded order of actions with unit costs per
chunk (forward 1, full backward 2, input-gradient 1, weight-gradient 1, divided by the
chunks per rank) and free communication, honouring the pipeline's dependencies: the tick
diagram of the schedule, drawn under what really happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import matplotlib.pyplot as plt

from helpers.core.plotting import save_figure
from helpers.pipeline.events import COMPUTE


class Recorded(Protocol):
    """What the charts read of one schedule's run (``results.ScheduleRun``)."""

    actions: list[dict]
    start_ns: int
    memory_actions: list[dict]
    memory_start_ns: int

    @property
    def ideal(self) -> list[dict]: ...


COLOURS = {"F": "#4c72b0", "B": "#dd8452", "I": "#e8a87c", "W": "#55a868", "wait": "#bbbbbb"}
NAMES = {"F": "forward", "B": "backward", "I": "backward, input gradient",
         "W": "backward, weight gradient", "wait": "waiting for a send or receive to complete"}
COST = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}


def _ready(kind: str, stage: int, mb: int, done: dict, last_stage: int) -> float | None:
    """When the action's input exists (None: not yet)."""
    if kind == "F":
        return 0.0 if stage == 0 else done.get(("F", stage - 1, mb))
    if kind in ("B", "I"):
        if stage == last_stage:
            return done.get(("F", stage, mb))
        return done.get(("B", stage + 1, mb), done.get(("I", stage + 1, mb)))
    return done.get(("I", stage, mb))  # W after its own I


def ideal_timeline(actions: Sequence[dict], ranks: int, chunks_per_rank: int, *,
                   measured_costs: bool = False) -> list[dict]:
    """The recorded order of each rank, replayed with free communication.

    Costs are unit costs (ticks), or with ``measured_costs`` each action's own measured
    duration (ms): what this order would take if sending and receiving cost nothing.
    Returns the actions with float ``start``/``end``.
    """
    order = {r: sorted((a for a in actions if a["rank"] == r and a["kind"] in COMPUTE),
                       key=lambda a: a["start_ns"]) for r in range(ranks)}
    last_stage = max(a["stage"] for a in actions if a["kind"] in COMPUTE)
    free, position, done, out = [0.0] * ranks, [0] * ranks, {}, []
    while any(position[r] < len(order[r]) for r in range(ranks)):
        progressed = False
        for r in range(ranks):
            while position[r] < len(order[r]):
                a = order[r][position[r]]
                ready = _ready(a["kind"], a["stage"], a["microbatch"], done, last_stage)
                if ready is None:
                    break
                start = max(free[r], ready)
                cost = ((a["end_ns"] - a["start_ns"]) / 1e6 if measured_costs
                        else COST[a["kind"]] / chunks_per_rank)
                end = start + cost
                done[(a["kind"], a["stage"], a["microbatch"])] = end
                out.append({**a, "start": start, "end": end})
                free[r], position[r], progressed = end, position[r] + 1, True
        if not progressed:
            raise ValueError("the recorded actions have a dependency cycle; cannot replay them")
    return out


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


def timeline_chart(runs: dict[str, Recorded], ranks: int, path: str | Path) -> Path:
    """Per schedule: the measured timeline (ms) above its ideal tick diagram (unit costs).

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
    fig.suptitle("The same order of work, measured (ms) and at ideal costs (ticks): where they\n"
                 "differ, a rank waited (grey) or an action cost more or less than its ticks",
                 fontsize=10)
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
