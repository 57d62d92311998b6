"""Lesson 06's figures: the collectives' times with their fitted lines, and DDP's backward
with each bucket's all-reduce on one time axis."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from helpers.core.plotting import save_figure
from helpers.runs.data_parallel.results import DataParallelResult


def plot_collectives(result: DataParallelResult, path: str | Path) -> Path:
    """Median time per call against bytes sent per rank (log-log), each with its fit."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (name, fit), marker in zip(result.fits().items(), "osd^", strict=True):
        sent = [b for b in fit.sent_bytes if b > 0]
        times = [t for b, t in zip(fit.sent_bytes, fit.times_s, strict=True) if b > 0]
        line = ax.plot(sent, [t * 1e3 for t in times], marker, label=f"{name} (measured)")[0]
        ax.plot(sent, [fit.predict(b) * 1e3 for b in sent], "-", color=line.get_color(),
                alpha=0.6, label=f"fit: {fit.alpha_s * 1e6:.0f} us + bytes / "
                f"{fit.bandwidth / 1e9:.2f} GB/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes sent by one rank per call (ring volume)")
    ax.set_ylabel("time per call (ms, median)")
    ax.set_title(f"Collectives on {result.world_size} {result.backend} ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_ddp_timeline(result: DataParallelResult, path: str | Path) -> Path:
    """Rank 0's timed DDP step: the backward's compute, and each bucket's all-reduce."""
    t = result.timeline
    fig, ax = plt.subplots(figsize=(8, 2.8))
    ms = 1e-6
    ax.broken_barh([(t.backward_start_ns * ms, (t.compute_end_ns - t.backward_start_ns) * ms)],
                   (len(t.buckets), 0.8), color="tab:blue", label="backward computing")
    for i, b in enumerate(t.buckets):
        ax.broken_barh([(b.start_ns * ms, (b.end_ns - b.start_ns) * ms)], (i, 0.8),
                       color="tab:orange", label="bucket all-reduce" if i == 0 else None)
        ax.text(b.end_ns * ms, i + 0.4, f" {b.nbytes / 2**20:.1f} MiB", va="center", fontsize=7)
    ax.axvline(t.backward_end_ns * ms, color="k", ls="--", lw=1, label="backward() returns")
    ax.set_yticks([i + 0.4 for i in range(len(t.buckets) + 1)],
                  [f"bucket {b.index}" for b in t.buckets] + ["compute"])
    ax.set_xlim(t.backward_start_ns * ms * 0.9, t.backward_end_ns * ms * 1.1)  # room for labels
    ax.set_xlabel("time since the step started (ms)")
    ax.set_title("DDP: each bucket's all-reduce starts when its last gradient is written")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return save_figure(fig, path)
