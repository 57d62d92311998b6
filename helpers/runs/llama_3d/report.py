"""Lesson 13's tables and charts, from the typed results (``results``, ``suite``)."""

from __future__ import annotations

import statistics
from pathlib import Path

from helpers.core.plotting import plt, save_figure
from helpers.runs.llama_3d.results import DIMS, LayoutRun


def proof_table(runs: list[LayoutRun]) -> str:
    """Each layout against the one-process run: losses and final weights."""
    lines = [f"{'layout':<20}{'ranks':>6}{'loss |diff| max':>17}{'of its tol.':>12}"
             f"{'weights |diff|':>16}{'tolerance':>11}  verdict"]
    for run in runs:
        lines.append(f"{run.name:<20}{run.layout.world_size:>6}"
                     f"{max(run.loss_diffs):>17.1e}{run.loss_share:>12.2f}{run.weight_diff:>16.1e}"
                     f"{run.weight_tolerance:>11.1e}  {'equal' if run.ok else 'DIFFERENT'}")
    return "\n".join(lines)


def _marks(name: str, pairs: list[tuple[int, int]]) -> list[str]:
    """A column headed ``name``: each measured value followed by "=" where it is the
    predicted one, else by "≠" and the prediction."""
    width = max(len(name), *(len(f"{m:,}") for m, _ in pairs))
    marks = ["=" if m == p else f"≠ {p:,}" for m, p in pairs]
    wide = max(map(len, marks))
    return [f"{name:>{width}} {'':<{wide}}"] + [
        f"{m:>{width},} {mark:<{wide}}" for (m, _), mark in zip(pairs, marks, strict=True)]


def ledger_table(runs: list[LayoutRun]) -> str:
    """Per layout and stage: each kind of memory in bytes, measured, with "=" where the
    prediction is the same and "≠ N" where it predicts N."""
    kinds = {"weights": "weights", "grads": "gradients", "optimizer_state": "optimizer",
             "activations": "activations"}
    rows = [(run.name, r) for run in runs for r in run.stage_ranks()]
    columns = [_marks(name, [(getattr(r.measured, k), getattr(r.predicted, k))
                             for _, r in rows]) for k, name in kinds.items()]
    firsts = [f"{'layout':<19}{'stage':>6}"] + [f"{layout:<19}{r.stage:>6}" for layout, r in rows]
    return "\n".join((first + "".join(f"  {c[k]}" for c in columns)).rstrip()
                     for k, first in enumerate(firsts))


def sent_table(runs: list[LayoutRun]) -> str:
    """Per layout and stage: the calls one rank issues per step along each mesh dimension
    and their KiB, by the ring formula and by gloo's algorithms (a pipeline's sends are
    the same either way). "dp" is ``fully_shard``'s group; with dp = 1 and cp > 1 it spans
    the cp ranks, and the cp columns hold both."""
    spans = {"dp": 20, "cp": 20, "tp": 20, "pp": 12}
    top = (f"{'':<25}" + "".join(f"{f' {d}, KiB ':-^{spans[d] - 1}} " for d in DIMS)).rstrip()
    head = (f"{'layout':<19}{'stage':>6}" + f"{'calls':>6}{'ring':>7}{'gloo':>7}" * 3
            + f"{'calls':>6}{'sent':>6}")
    lines = [top, head]
    for run in runs:
        for r in run.stage_ranks():
            t, cells = r.traffic, ""
            for d in DIMS:
                if d not in r.predicted_ring:
                    cells += f"{'-':>{spans[d]}}"
                elif d == "pp":
                    cells += f"{t.calls[d]:>6.0f}{t.ring[d] / 1024:>6.0f}"
                else:
                    cells += (f"{t.calls[d]:>6.0f}{t.ring[d] / 1024:>7.0f}"
                              f"{t.gloo[d] / 1024:>7.0f}")
            lines.append(f"{run.name:<19}{r.stage:>6}{cells}")
    return "\n".join(lines)


def wire_table(runs: list[LayoutRun]) -> str:
    """Per layout and stage: one rank's bytes per step, all dimensions together, by the
    ring formula, by gloo's algorithms, and on its sockets; the wire's excess over gloo's
    payload beside the most gloo's headers can add ("=" where it is exactly that)."""
    lines = [f"{'layout':<19}{'stage':>6}{'ring formula':>14}{'gloo algorithms':>17}"
             f"{'on the wire':>14}{'wire - gloo':>13}  header bound"]
    for run in runs:
        for r in run.stage_ranks():
            t = r.traffic
            ring, gloo = sum(t.ring.values()), t.total_gloo
            wire = "not read" if t.wire is None else f"{t.wire:,.0f}"
            extra = "" if t.wire is None else f"{t.wire - gloo:,.0f}"
            bound = "=" if t.wire is not None and t.wire - gloo == t.headers else (
                f"{t.headers:,.0f}")
            lines.append(f"{run.name:<19}{r.stage:>6}{ring:>14,.0f}{gloo:>17,.0f}"
                         f"{wire:>14}{extra:>13}  {bound:>12}")
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
            lines.append(f"{run.name:<20}{r.stage:>6}{mean * 1e3:>9.1f} ± "
                         f"{std * 1e3:<4.1f}" + "".join(f"{r.comm_s.get(d, 0) * 1e3:>10.1f}"
                                                       for d in DIMS) + f"{rest * 1e3:>14.1f}")
    return "\n".join(lines)


def time_chart(runs: list[LayoutRun], path: str | Path, *, title: str) -> Path:
    """Rank 0's mean step, one horizontal bar per layout, stacked: the time in each
    dimension's traffic, then the rest (computation, and waiting for a core)."""
    labels = [r.name for r in runs]
    parts: dict[str, list[float]] = {f"{d} traffic": [] for d in DIMS}
    parts["computation (the rest)"] = []
    for run in runs:
        comm = run.ranks[0].comm_s
        for d in DIMS:
            parts[f"{d} traffic"].append(comm.get(d, 0) * 1e3)
        parts["computation (the rest)"].append(
            statistics.mean(run.ranks[0].step_s) * 1e3 - sum(comm.values()) * 1e3)
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(runs) + 1.6))
    left = [0.0] * len(runs)
    for name, values in parts.items():
        ax.barh(labels, values, 0.6, left=left, label=name)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.invert_yaxis()  # one device on top
    ax.set_xlabel("time per training step on rank 0 (ms)")
    ax.xaxis.grid(True)
    ax.set_axisbelow(True)
    ax.set_title(title, fontsize=10)
    fig.legend(loc="lower center", ncols=len(parts), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return save_figure(fig, path)


def loss_chart(runs: list[LayoutRun], path: str | Path, *, floor: float, title: str) -> Path:
    """The loss of every step, one line per layout, on top of the one-process run (the
    plain model and loop, no mesh), drawn wide and grey beneath them; the MoE model has a
    one-process run of its own, drawn the same way."""
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    references = {}
    for run in runs:
        what = "the MoE model, one process" if run.experts else "one process, no mesh"
        references.setdefault(f"{what} (the reference)", run.reference)
    for label, ref in references.items():
        ax.plot(range(len(ref)), ref, color="black", linewidth=6, alpha=0.2, label=label)
    ref = runs[0].reference
    markers = "osD^v<>p"
    for k, run in enumerate(runs):
        name = run.name
        if name == "one device":
            name = "one device: the 3-D loop on a 1 x 1 x 1 mesh"
        ax.plot(range(len(run.losses)), run.losses, marker=markers[k % len(markers)],
                markersize=4, linewidth=1, label=name)
    ax.axhline(floor, color="grey", linestyle="--", linewidth=1)
    ax.annotate("the chain's entropy: the lowest loss any model can reach", (len(ref) - 1, floor),
                xytext=(0, 4), textcoords="offset points", ha="right", va="bottom",
                fontsize=8, color="dimgrey")
    ax.set_xlabel("training step")
    ax.set_ylabel("cross-entropy loss (nats per token)")
    ax.set_title(title)
    ax.set_ylim(floor - 0.15, max(max(r) for r in references.values()) + 0.15)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=3,
              frameon=False)  # below the axes, clear of the curves whatever they do
    return save_figure(fig, path)
