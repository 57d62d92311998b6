"""What every data-parallel rank's step shares (DDP, the hand ZeRO, FSDP2): its rows of
the batch, the Adam optimizer, snapshots of named tensors, and the bytes of what it holds."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def rows_of(t: torch.Tensor, rank: int, world_size: int, part: int = 0,
            parts: int = 1) -> torch.Tensor:
    """Rank ``rank``'s share of the batch (and micro-batch ``part`` of ``parts`` of it), as
    its own tensor, as a rank's data loader would give it."""
    per = t.shape[0] // world_size
    mine = t[rank * per:(rank + 1) * per]
    step = per // parts
    return mine[part * step:(part + 1) * step].clone()


def adam(params: Iterable[torch.Tensor], lr: float) -> torch.optim.Adam:
    """The optimizer of every run in the lesson (one tensor at a time: no foreach copies)."""
    return torch.optim.Adam(list(params), lr=lr, foreach=False)


def named_copy(pairs: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """(name, a detached copy on the CPU) of each named tensor."""
    return [(n, t.detach().cpu().clone()) for n, t in pairs]


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a view is not counted twice)."""
    seen = {}
    for t in tensors:
        if t is not None:
            s = t.untyped_storage()
            seen[s._cdata] = s.nbytes()
    return sum(seen.values())


def optimizer_state(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor the optimizer keeps (Adam: both moments and the step counters)."""
    return [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
