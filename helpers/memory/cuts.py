"""Where to cut a layer list so that the stages hold about the same memory."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from helpers.memory.estimate import estimate_layers


def stage_totals_by_cut(
    layers: Sequence[nn.Module], sample_shape: Sequence[int], *, batch: int,
    optimizer: str = "sgd", loss: str = "mse",
) -> dict[int, list[int]]:
    """For every two-stage cut (before layer i, i = 1 .. n-1): predicted bytes per stage.

    Memory is not a sum over layers (the activation at the cut is kept on both sides),
    so each cut gets its own estimate.
    """
    return {
        i: [row.total for row in estimate_layers(layers, sample_shape, batch=batch, split_points=[i],
                                                 optimizer=optimizer, loss=loss).rows.values()]
        for i in range(1, len(layers))
    }


def memory_balanced_cut(totals: dict[int, list[int]]) -> int:
    """The cut whose fuller stage holds the least."""
    if not totals:
        raise ValueError("no cut to choose from; valid: a layer list of at least 2 layers")
    return min(totals, key=lambda i: max(totals[i]))
