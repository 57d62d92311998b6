"""What it costs to carry an activation from one device to the next."""

from __future__ import annotations

from collections.abc import Callable

import torch

from helpers.core.timing import measure

# Theoretical peak bandwidth per direction, in GB/s (vendor specifications).
LINKS_GB_S = {
    "PCIe 4.0 x16": 32.0,
    "PCIe 5.0 x16": 64.0,
    "NVLink 4 (H100/H200)": 450.0,
}


def copy_between(
    tensor: torch.Tensor, dst: torch.device
) -> tuple[Callable[[], torch.Tensor], bool]:
    """A function copying ``tensor`` to ``dst``, and whether the copy is simulated.

    When source and destination are the same device, ``tensor.to(dst)`` returns the
    tensor itself and moves nothing; a ``clone()`` (one memory copy) stands in for it.
    """
    if tensor.device == torch.device(dst):
        return tensor.clone, True
    return (lambda: tensor.to(dst)), False


def transfer_rows(
    sizes_mb: list[float], src: torch.device, dst: torch.device, *, repeats: int, warmup: int = 1
) -> list[dict]:
    """Measured copy time and bandwidth for activations of ``sizes_mb`` megabytes (float32)."""
    rows = []
    for mb in sizes_mb:
        tensor = torch.empty(int(mb * 1e6) // 4, dtype=torch.float32, device=src).uniform_()
        fn, simulated = copy_between(tensor, dst)
        timing = measure(fn, repeats=repeats, warmup=warmup, label=f"{mb:g} MB")
        row = {"size_mb": mb, "seconds": timing.mean, "std": timing.std, "simulated": simulated}
        row["gb_s"] = mb / 1e3 / timing.mean
        for link, gb_s in LINKS_GB_S.items():
            row[link] = mb / 1e3 / gb_s
        rows.append(row)
    return rows


def format_transfer_rows(rows: list[dict]) -> str:
    """The rows as a text table: measured time, then the time each link would take."""
    links = list(LINKS_GB_S)
    head = f"{'size':>8} {'measured':>12} {'GB/s':>7}  " + "  ".join(f"{k:>22}" for k in links)
    lines = [head]
    for r in rows:
        tag = " (sim.)" if r["simulated"] else ""
        lines.append(
            f"{r['size_mb']:>6g}MB {r['seconds'] * 1e3:>9.3f} ms {r['gb_s']:>7.1f}  "
            + "  ".join(f"{r[k] * 1e3:>19.3f} ms" for k in links)
            + tag
        )
    return "\n".join(lines)
