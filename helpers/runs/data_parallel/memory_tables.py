"""Lesson 06's memory tables, narrow enough for a notebook's output area: each stage's
ledger measured beside its prediction, PyTorch's tracker beside the course's ledger, and
what fits on one card."""

from __future__ import annotations

import textwrap

from helpers.core.sizes import format_bytes
from helpers.memory.fits import Fit
from helpers.memory.ledger import KINDS, DeviceMemory, Ledger

HEADS = ("weights", "grads", "optimizer", "activations", "total")


def _cells(row: DeviceMemory) -> list[int]:
    return [*(getattr(row, k) for k in KINDS), row.total]


def ledger_table(measured: Ledger, predicted: Ledger, title: str = "") -> str:
    """Each row's measured ledger, then ``✓`` where the prediction equals it byte for byte
    in every kind, else ``✗`` and a line naming the kinds where it differs, predicted."""
    width = max([len(n) for n in measured.rows] + [6])
    lines = [title] if title else []
    lines.append(f"{'':<{width}}" + "".join(f"{h:>13}" for h in HEADS) + "  = predicted")
    for name, row in measured.rows.items():
        guess = predicted[name]
        wrong = [f"{k} {format_bytes(getattr(guess, k))}" for k in KINDS
                 if getattr(guess, k) != getattr(row, k)]
        lines.append(f"{name:<{width}}" + "".join(f"{format_bytes(c):>13}" for c in _cells(row))
                     + "  " + ("✗" if wrong else "✓"))
        if wrong:
            lines += textwrap.wrap("predicted: " + ", ".join(wrong), 100, initial_indent="  ",
                                   subsequent_indent="    ")
    return "\n".join(lines)


def fits_lines(rows: list[Fit], gpu_bytes: int) -> str:
    """The estimator's fullest GPU per (model, layout), and whether it fits ``gpu_bytes``."""
    widths = (11, 11, 12, 13, 12)
    lines = [f"{'model':<10}{'layout':<19}{'GPUs':>5}"
             + "".join(f"{h:>{w}}" for h, w in zip(HEADS, widths, strict=True)) + "  fits?"]
    for r in rows:
        lines.append(f"{r.model:<10}{r.layout:<19}{r.gpus:>5}"
                     + "".join(f"{format_bytes(c):>{w}}"
                               for c, w in zip(_cells(r.memory), widths, strict=True))
                     + f"  {'yes' if r.fits else 'no'}")
    return "\n".join([f"per GPU; fits: total <= {format_bytes(gpu_bytes)}", *lines])


def fits_summary(rows: list[Fit], gpu_bytes: int) -> str:
    """Per model: the data-parallel row's total, how many layouts fit, and the first that
    does (in the table's order), in one line each."""
    lines = [f"per GPU of {format_bytes(gpu_bytes)}, by the estimator:"]
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model]
        fit = [r for r in mine if r.fits]
        first = (f"first: {fit[0].layout} ({format_bytes(fit[0].memory.total)})" if fit
                 else "none")
        lines.append(f"  {model:<10} {mine[0].layout}: {format_bytes(mine[0].memory.total)}; "
                     f"{len(fit)} of {len(mine)} fit; {first}")
    return "\n".join(lines)
