"""Lesson 10's tables and charts, from the typed results (``results``, ``suite``)."""

from __future__ import annotations

import statistics
from pathlib import Path

from helpers.core.plotting import plt, save_figure, stacked_bar_chart
from helpers.core.sizes import format_bytes
from helpers.runs.llama_3d.results import DIMS, LayoutRun


def proof_table(runs: list[LayoutRun]) -> str:
    """Each layout against the one-process run: losses and final weights."""
    lines = [f"{'layout':<20}{'ranks':>6}{'loss |diff| max':>17}{'of its tol.':>12}"
             f"{'weights |diff|':>16}{'tolerance':>11}  verdict"]
    for run in runs:
        lines.append(f"{str(run.layout):<20}{run.layout.world_size:>6}"
                     f"{max(run.loss_diffs):>17.1e}{run.loss_share:>12.2f}{run.weight_diff:>16.1e}"
                     f"{run.weight_tolerance:>11.1e}  {'equal' if run.ok else 'DIFFERENT'}")
    return "\n".join(lines)


def ledger_table(runs: list[LayoutRun]) -> str:
    """Per layout and stage: each kind of memory, measured / predicted (bytes)."""
    kinds = ("weights", "grads", "optimizer_state", "activations")
    head = "".join(f"{k.replace('optimizer_state', 'optimizer'):>24}" for k in kinds)
    lines = [f"{'layout':<20}{'stage':>6}{head}"]
    for run in runs:
        for r in run.stage_ranks():
            cells = "".join(f"{getattr(r.measured, k):>11,} / {getattr(r.predicted, k):<10,}"
                            for k in kinds)
            lines.append(f"{str(run.layout):<20}{r.stage:>6}{cells}")
    return "\n".join(lines)


def sent_table(runs: list[LayoutRun]) -> str:
    """Per layout and stage: the calls one rank issues per step along each mesh dimension
    and their bytes, by the ring formula and by gloo's algorithms (a pipeline's sends are
    the same either way)."""
    spans = {"dp": 30, "tp": 30, "pp": 19}
    top = f"{'':<26}" + "".join(f"  {f' {d} ':-^{spans[d] - 2}}" for d in DIMS)
    head = (f"{'layout':<20}{'stage':>6}" + f"{'calls':>8}{'ring':>11}{'gloo':>11}" * 2
            + f"{'calls':>8}{'bytes':>11}")
    lines = [top, head]
    for run in runs:
        for r in run.stage_ranks():
            t, cells = r.traffic, ""
            for d in DIMS:
                if d not in r.predicted_ring:
                    cells += f"{'-':>{spans[d]}}"
                elif d == "pp":
                    cells += f"{t.calls[d]:>8.0f}{format_bytes(t.ring[d]):>11}"
                else:
                    cells += (f"{t.calls[d]:>8.0f}{format_bytes(t.ring[d]):>11}"
                              f"{format_bytes(t.gloo[d]):>11}")
            lines.append(f"{str(run.layout):<20}{r.stage:>6}{cells}")
    return "\n".join(lines)


def wire_table(runs: list[LayoutRun]) -> str:
    """Per layout and stage: one rank's bytes per step, all dimensions together, by the
    ring formula, by gloo's algorithms, and on its sockets, with gloo's headers."""
    lines = [f"{'layout':<20}{'stage':>6}{'ring formula':>14}{'gloo algorithms':>17}"
             f"{'on the wire':>14}{'wire - gloo':>13}{'header bound':>14}"]
    for run in runs:
        for r in run.stage_ranks():
            t = r.traffic
            ring, gloo = sum(t.ring.values()), t.total_gloo
            wire = "not read" if t.wire is None else f"{t.wire:,.0f}"
            extra = "" if t.wire is None else f"{t.wire - gloo:,.0f}"
            lines.append(f"{str(run.layout):<20}{r.stage:>6}{ring:>14,.0f}{gloo:>17,.0f}"
                         f"{wire:>14}{extra:>13}{t.headers:>14,.0f}")
    return "\n".join(lines)


def time_table(runs: list[LayoutRun]) -> str:
    """Per layout and pipeline stage (one rank each): the step (mean +- std) and its time in
    each dimension's traffic, in ms."""
    lines = [f"{'layout':<20}{'stage':>6}{'step, ms':>16}" + "".join(f"{d + ', ms':>10}" for d in DIMS)
             + f"{'the rest, ms':>14}"]
    for run in runs:
        for r in run.stage_ranks():
            mean = statistics.mean(r.step_s)
            std = statistics.stdev(r.step_s) if len(r.step_s) > 1 else 0.0
            rest = mean - sum(r.comm_s.values())
            lines.append(f"{str(run.layout):<20}{r.stage:>6}{mean * 1e3:>9.1f} ± "
                         f"{std * 1e3:<4.1f}" + "".join(f"{r.comm_s.get(d, 0) * 1e3:>10.1f}"
                                                       for d in DIMS) + f"{rest * 1e3:>14.1f}")
    return "\n".join(lines)


def time_chart(runs: list[LayoutRun], path: str | Path, *, title: str) -> Path:
    """Rank 0's mean step, stacked: the time in each dimension's traffic, then the rest."""
    labels = [str(r.layout).replace(" x ", "\n") for r in runs]
    parts: dict[str, list[float]] = {f"{d} traffic": [] for d in DIMS}
    parts["computation (the rest)"] = []
    for run in runs:
        comm = run.ranks[0].comm_s
        for d in DIMS:
            parts[f"{d} traffic"].append(comm.get(d, 0) * 1e3)
        parts["computation (the rest)"].append(
            statistics.mean(run.ranks[0].step_s) * 1e3 - sum(comm.values()) * 1e3)
    return stacked_bar_chart(labels, parts, path, ylabel="time per training step on rank 0 (ms)",
                             xlabel="layout", title=title)


def loss_chart(runs: list[LayoutRun], path: str | Path, *, floor: float, title: str) -> Path:
    """The loss of every step, one line per layout, on top of the one-process run."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    ref = runs[0].reference
    ax.plot(range(len(ref)), ref, color="black", linewidth=5, alpha=0.25, label="one process")
    markers = "osD^v<>p"
    for k, run in enumerate(runs):
        ax.plot(range(len(run.losses)), run.losses, marker=markers[k % len(markers)],
                markersize=4, linewidth=1, label=str(run.layout))
    ax.axhline(floor, color="grey", linestyle="--", linewidth=1,
               label="the chain's entropy (lowest loss)")
    ax.set_xlabel("training step")
    ax.set_ylabel("cross-entropy loss (nats per token)")
    ax.set_title(title)
    ax.legend(fontsize=8, ncols=2)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)
