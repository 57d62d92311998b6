"""Lesson 06's figures and tables: the collectives' times with their fitted lines, the
bytes a rank sent three ways (ring formula, gloo's algorithms, the wire), and DDP's
backward with each bucket's all-reduce on one time axis."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from helpers.comm.collectives import COLLECTIVES
from helpers.core.plotting import save_figure
from helpers.runs.data_parallel.results import DataParallelResult

ALLOWED = "gloo's payload + [0, its headers] (48 B a message, counted from its algorithms)"
THREE_WAYS = ("ring formula", "gloo's algorithms", "on the wire")


def _under(result: DataParallelResult) -> tuple[str, str, str]:
    """What each of the three ways is: NCCL's ring, gloo (this run's backend?), measured."""
    return ("(NCCL's ring)", "(this backend)" if result.backend == "gloo" else "(not this one)",
            "(measured)")


def _headers(values: set[int]) -> str:
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,} to {high:,}"


def sweep_table(result: DataParallelResult) -> str:
    """Per collective, the bytes one call sent three ways at the largest size (rank 0),
    then the wire's excess over gloo's payload at every size, per rank, and its verdict."""
    largest = max(row.nbytes for row in result.sweep)
    rows = {row.collective: row for row in result.sweep if row.nbytes == largest}
    lines = [f"{'bytes one call sends, rank 0':<30}" + "".join(f"{h:>20}" for h in THREE_WAYS),
             f"{f'full tensor S = {largest:,} B':<30}" + "".join(f"{h:>20}" for h in _under(result))]
    for name in COLLECTIVES:
        row = rows[name]
        wire = f"{row.wire[0]:,}" if row.wire is not None else "not read"
        lines.append(f"{name:<30}{row.ring:>20,.0f}{row.gloo[0]:>20,.0f}{wire:>20}")
    if result.wire_reason is not None:
        return "\n".join([*lines, f"the wire was not read: {result.wire_reason}"])
    sizes = len({row.nbytes for row in result.sweep})
    ranks = " / ".join(f"rank {q}" for q in range(result.world_size))
    lines.append(f"wire - gloo (bytes), {ranks}, over the {sizes} sizes:")
    for name in COLLECTIVES:
        mine = [row.headers for row in result.sweep if row.collective == name]
        per_rank = [_headers({h[q] for h in mine}) for q in range(result.world_size)]
        lines.append(f"  {name:<16}" + " / ".join(per_rank))
    ok = all(row.wire_ok for row in result.sweep)
    lines += [f"wire allowed: {ALLOWED}",
              f"every call within it: {'OK' if ok else 'FAILED'}"]
    return "\n".join(lines)


def sweep_summary(result: DataParallelResult) -> str:
    """At the largest size, what one call sent (rank 0) over the ring formula's bytes, per
    collective, and the verdict on every swept call's wire, in three lines."""
    largest = max(row.nbytes for row in result.sweep)
    rows = [row for row in result.sweep if row.nbytes == largest]
    how = "on the wire" if result.wire_reason is None else "by gloo's algorithms"
    ratios = ", ".join(f"{row.collective} {_sent(row) / row.ring:.2f}" for row in rows)
    ok = all(row.wire_ok is not False for row in result.sweep)
    return (f"one call of S = {largest:,} B, rank 0's bytes {how} / the ring formula's:\n  "
            f"{ratios}\n{'✓' if ok else '✗'} every call's wire = gloo's payload + [0, its headers]")


def _sent(row) -> float:
    return float(row.wire[0]) if row.wire is not None else row.gloo[0]


def fit_lines(result: DataParallelResult) -> str:
    """Per collective, the alpha-beta fit against what rank 0 sent, and its residuals."""
    fits = result.fits()
    sizes = len(next(iter(fits.values())).times_s)
    lines = [f"{'':<15}{'alpha':>9}{'1/beta':>11}   residuals at the {sizes} sizes, "
             "(measured - fit) / measured"]
    for name, fit in fits.items():
        lines.append(f"{name:<15}{fit.alpha_s * 1e6:>6.0f} us{fit.bandwidth / 1e9:>6.2f} GB/s   "
                     + " ".join(f"{r:+.0%}" for r in fit.relative_residuals))
    return "\n".join(lines)


def bucket_lines(result: DataParallelResult) -> str:
    """DDP's buckets from its second step on: bytes, and the parameters from first to last."""
    lines = []
    for b in result.buckets:
        span = b.params[0] if len(b.params) == 1 else f"{b.params[0]} to {b.params[-1]}"
        count = f"{len(b.params)} tensor{'s' if len(b.params) > 1 else ''}"
        lines.append(f"  bucket {b.index}: {b.nbytes:>9,} B, {count:>10}: {span}")
    return "\n".join(lines)


def fit_ratios(result: DataParallelResult) -> str:
    """Per collective, the bandwidth 1/beta fitted against the ring formula over the one
    fitted against what was sent: how far the ring formula mis-states the link."""
    sent, ring = result.fits("sent"), result.fits("ring")
    against = ("the wire" if result.wire_reason is None else
               "gloo's algorithms" if result.backend == "gloo" else "the ring formula (NCCL's)")
    lines = [f"1/beta fitted against the ring formula / 1/beta fitted against {against}:"]
    for name in COLLECTIVES:
        # the fits weight each size by 1/t alone, so bytes that are a multiple of the
        # others plus a constant give a slope in the same ratio
        lines.append(f"  {name:<16}{sent[name].beta_s_per_byte / ring[name].beta_s_per_byte:.2f}")
    return "\n".join(lines)


def bytes_table(result: DataParallelResult) -> str:
    """Per run, what rank 0 sent in one step three ways, and each against DDP's."""
    measured, gloo = result.wire_reason is None, result.backend == "gloo"
    key = "on the wire" if measured else "gloo's algorithms" if gloo else "the ring formula"
    head = (f"{'rank 0, one step':<17}{'calls':>6}" + "".join(f"{h:>19}" for h in THREE_WAYS)
            + f"{'headers':>12}{'x DDP':>7}")
    lines = [head, f"{'':<23}" + "".join(f"{h:>19}" for h in _under(result))
             + f"{'(wire-gloo)':>12}"
             + f"{'(' + key.split()[-1] + ')':>7}"]

    def total(run) -> float:
        if measured:
            return float(run.traffic.wire)
        return run.traffic.total_gloo if gloo else run.traffic.total_ring

    ddp = total(result.runs["DDP"])
    for name, run in result.runs.items():
        t = run.traffic
        wire = f"{t.wire:,}" if t.wire is not None else "not read"
        excess = f"{t.wire - t.total_gloo:,.0f}" if t.wire is not None else "-"
        ratio = f"{total(run) / ddp:.2f}" if ddp else "-"
        lines.append(f"{name:<17}{len(t.issued):>6}{t.total_ring:>19,.0f}{t.total_gloo:>19,.0f}"
                     f"{wire:>19}{excess:>12}{ratio:>7}")
    if not measured:
        lines.append(f"({key} in the last column; the wire was not read: {result.wire_reason})")
    return "\n".join(lines)


def ratio_lines(result: DataParallelResult, names: tuple[str, ...] = ("ZeRO-1", "ZeRO-2",
                                                                      "ZeRO-3")) -> str:
    """Rank 0's bytes in one step over DDP's, for the runs ``names``: by the ring formula,
    and as this run sent them (the wire; else gloo's algorithms); then the bytes verdict."""
    ddp, runs = result.runs["DDP"].traffic, [result.runs[n] for n in names]
    measured = result.wire_reason is None

    def sent(t) -> float:
        return float(t.wire) if measured else t.total_gloo

    lines = [f"{'one step, x DDP (rank 0)':<30}" + "".join(f"{n:>13}" for n in names)]
    for label, value in (("by the ring formula (NCCL)", lambda t: t.total_ring / ddp.total_ring),
                         ("on the wire (gloo)" if measured else "gloo's algorithms",
                          lambda t: sent(t) / sent(ddp))):
        lines.append(f"  {label:<28}" + "".join(f"{value(r.traffic):>13.2f}" for r in runs))
    checks = result.traffic_checks()
    mark = "✓" if result.traffic_ok else "✗"
    lines.append(f"{mark} every run's calls and sizes = its plan, wire within gloo + its headers "
                 f"({len(checks)} runs)")
    return "\n".join(lines)


def traffic_lines(result: DataParallelResult) -> str:
    """Each run's bytes verdict, one line each, under the allowance it uses."""
    return "\n".join([f"calls: issued, with their sizes, against the plan from the model's "
                      f"shapes\nwire, per call: {ALLOWED}",
                      *(check.line() for check in result.traffic_checks())])


def _log_ticks(axis, low: float, high: float, steps: tuple[float, ...], label) -> None:
    """Plain labels on a log axis: a tick at each of ``steps`` times a power of ten between
    ``low`` and ``high``, written by ``label``; no minor labels."""
    ticks = [m * 10.0**e for e in range(math.floor(math.log10(low)) - 1,
                                       math.ceil(math.log10(high)) + 1) for m in steps]
    axis.set_major_locator(FixedLocator([t for t in ticks if low <= t <= high]))
    axis.set_major_formatter(FuncFormatter(lambda v, _: label(v)))
    axis.set_minor_formatter(NullFormatter())


def _decimal_bytes(value: float) -> str:
    for unit, size in (("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:g} {unit}"
    return f"{value:g} B"


def plot_collectives(result: DataParallelResult, path: str | Path) -> Path:
    """Median time per call against the bytes rank 0 sent per call (log-log), each with its
    fit: on the wire where it was read, else by gloo's algorithms."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    handles, sent_all, times_all = [], [], []
    for (name, fit), marker in zip(result.fits().items(), "osd^", strict=True):
        sent = [b for b in fit.sent_bytes if b > 0]
        times = [t * 1e3 for b, t in zip(fit.sent_bytes, fit.times_s, strict=True) if b > 0]
        line = ax.plot(sent, times, marker, ls="none")[0]
        dense = np.geomspace(min(sent), max(sent), 60)  # the straight line t(bytes), drawn log-log
        ax.plot(dense, [fit.predict(b) * 1e3 for b in dense], "-", color=line.get_color(),
                alpha=0.6)
        handles.append(Line2D([], [], color=line.get_color(), marker=marker, label=(
            f"{name}: α = {fit.alpha_s * 1e6:.0f} us, 1/β = {fit.bandwidth / 1e9:.2f} GB/s")))
        sent_all += sent
        times_all += times + [fit.predict(b) * 1e3 for b in sent]
    ax.set_xscale("log")
    ax.set_yscale("log")
    _log_ticks(ax.xaxis, min(sent_all) / 1.5, max(sent_all) * 1.5, (1,), _decimal_bytes)
    _log_ticks(ax.yaxis, min(times_all) / 1.5, max(times_all) * 1.5, (1, 2, 5),
               lambda v: f"{v:g}")
    what = "on the wire" if result.wire_reason is None else "by gloo's algorithms"
    ax.set_xlabel(f"bytes rank 0 sent per call ({what})")
    ax.set_ylabel("time per call (ms, median)")
    ax.set_title("A call costs a fixed α until its bytes take over")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16),
              ncol=2, title=f"{result.world_size} {result.backend} ranks; markers: measured, "
              "lines: fitted, t = α + β·bytes", title_fontsize=8, frameon=False)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_ddp_timeline(result: DataParallelResult, path: str | Path) -> Path:
    """Rank 0's timed DDP step: the backward's compute, and each bucket's all-reduce."""
    t = result.timeline
    fig, ax = plt.subplots(figsize=(7.5, 3.0))
    ms = 1e-6
    ax.broken_barh([(t.backward_start_ns * ms, (t.compute_end_ns - t.backward_start_ns) * ms)],
                   (len(t.buckets), 0.8), color="tab:blue", label="backward computing")
    for i, b in enumerate(t.buckets):
        ax.broken_barh([(b.start_ns * ms, (b.end_ns - b.start_ns) * ms)], (i, 0.8),
                       color="tab:orange", label="a bucket's all-reduce" if i == 0 else None)
    ax.axvline(t.backward_end_ns * ms, color="k", ls="--", lw=1, label="backward() returns")
    ax.set_yticks([i + 0.4 for i in range(len(t.buckets) + 1)],
                  [f"bucket {b.index} ({b.nbytes / 2**20:.1f} MiB)" for b in t.buckets]
                  + ["backward"])
    span = (t.backward_end_ns - t.backward_start_ns) * ms
    ax.set_xlim(t.backward_start_ns * ms - 0.05 * span, t.backward_end_ns * ms + 0.05 * span)
    ax.set_xlabel("time since the step started (ms)")
    ax.set_title("Each bucket's all-reduce starts when its last gradient is written")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3,
              frameon=False)
    fig.tight_layout()
    return save_figure(fig, path)
