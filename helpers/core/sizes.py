"""Counting a model: its parameters, and bytes written for people."""

from __future__ import annotations

from torch import nn


def parameter_count(model: nn.Module) -> int:
    """Number of parameters (elements); works on the meta device too."""
    return sum(p.numel() for p in model.parameters())


def format_bytes(n: float) -> str:
    """Bytes in binary units, e.g. '1.00 MiB'; whole bytes below 1 KiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"
