"""What every rank of lesson 06 shares: the model, the batch, the one-process reference step,
and the ledger of what a rank holds (measured from the tensors themselves)."""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn

from helpers.core.checks import StepResult, max_abs_diff, training_step
from helpers.memory.measure import default_loss
from helpers.models.llama import TinyLM, build_lm


def build_model(lm_config, device: torch.device | str = "cpu") -> TinyLM:
    """Lesson 05's Llama-shaped model, seeded, in training mode."""
    return build_lm(lm_config, seed=0).train().to(device)


def global_batch(vocab: int, batch: int, seq: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, next-token labels) of the whole step, the same on every rank."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)


def rows_of(t: torch.Tensor, rank: int, world_size: int, part: int = 0, parts: int = 1) -> torch.Tensor:
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
    return [(n, t.detach().cpu().clone()) for n, t in pairs]


def reference_step(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor,
                   lr: float) -> StepResult:
    """One process, the whole batch, one Adam step, on a copy of ``model``."""
    return training_step(copy.deepcopy(model), ids, labels, loss_fn=default_loss,
                         optimizer=lambda params: adam(params, lr))


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a view is not counted twice)."""
    seen = {}
    for t in tensors:
        if t is not None:
            s = t.untyped_storage()
            seen[s._cdata] = s.nbytes()
    return sum(seen.values())


def optimizer_state(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def max_diff(pairs_a, pairs_b) -> float:
    """Largest |a - b| over matching named tensors (names must agree)."""
    worst = 0.0
    for (na, a), (nb, b) in zip(pairs_a, pairs_b, strict=True):
        if na != nb:
            raise ValueError(f"parameters out of order: {na!r} vs {nb!r}")
        worst = max(worst, max_abs_diff(a, b))
    return worst


def max_relative_diff(pairs_a, pairs_b) -> float:
    """Largest ||a - b|| / ||b|| over matching named tensors (a whole tensor's relative error)."""
    worst = 0.0
    for (na, a), (nb, b) in zip(pairs_a, pairs_b, strict=True):
        if na != nb:
            raise ValueError(f"parameters out of order: {na!r} vs {nb!r}")
        a, b = a.detach().cpu().float(), b.detach().cpu().float()
        worst = max(worst, ((a - b).norm() / b.norm().clamp_min(1e-30)).item())
    return worst
