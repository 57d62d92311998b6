"""What it costs to carry an activation from one device to the next."""

from __future__ import annotations

from collections.abc import Callable

import torch

from helpers.core.timing import measure

# Theoretical peak bandwidth per direction, in GB/s: half of what NVIDIA's H100 page
# (https://www.nvidia.com/en-us/data-center/h100/) lists for both directions together,
# PCIe Gen5 128 GB/s and NVLink 900 GB/s (H100 SXM).
LINKS_GB_S = {
    "PCIe 5.0 x16": 64.0,
    "NVLink 4 (H100 SXM)": 450.0,
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
        rows.append(
            {
                "size_mb": mb,
                "seconds": timing.mean,
                "std": timing.std,
                "simulated": simulated,
                "gb_s": mb / 1e3 / timing.mean,
            }
        )
    return rows


def format_seconds(seconds: float) -> str:
    """A duration with a unit that keeps three significant digits: ns, us or ms."""
    for unit, scale in (("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def format_transfer_rows(rows: list[dict]) -> str:
    """The measured copies as a table: size, what was copied, time, bandwidth."""
    lines = [f"{'size':>9}  {'copy':<24} {'mean time':>10} {'GB/s':>7}"]
    for r in rows:
        what = "clone() (simulated)" if r["simulated"] else "tensor.to(dst)"
        lines.append(
            f"{r['size_mb']:>7g}MB  {what:<24} {format_seconds(r['seconds']):>10} {r['gb_s']:>7.2f}"
        )
    return "\n".join(lines)


def link_times(sizes_mb: list[float]) -> str:
    """What each link would take for these sizes at its theoretical peak, per direction."""
    lines = [f"{'size':>9}  " + "  ".join(f"{k:>20}" for k in LINKS_GB_S)]
    for mb in sizes_mb:
        cells = [format_seconds(mb / 1e3 / gb_s) for gb_s in LINKS_GB_S.values()]
        lines.append(f"{mb:>7g}MB  " + "  ".join(f"{c:>20}" for c in cells))
    return "\n".join(lines)
