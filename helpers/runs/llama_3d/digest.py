"""A fingerprint of a model's weights that does not depend on how they were split.

Each parameter's whole value is hashed (SHA-256 of its name and bytes) by a rank of the
stage that holds it; the fingerprint is the hash of those hashes in the model's own
parameter order. One process, or any mesh, holding bit-for-bit the same weights gives
the same fingerprint; one bit anywhere changes it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch
import torch.distributed as dist

from helpers.composed.experts import model_structure
from helpers.composed.training import whole
from helpers.expert_parallel.moe import MoEShape
from helpers.models.llama import LMConfig


def parameter_hashes(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    """SHA-256 of each parameter's name and whole value."""
    out = {}
    for name, p in named:
        value = whole(p.detach()).contiguous().cpu()
        out[name] = hashlib.sha256(name.encode() + value.numpy().tobytes()).hexdigest()
    return out


def fingerprint(hashes: dict[str, str], order: list[str]) -> str:
    """The hash of the parameters' hashes, in ``order`` (the model's parameter names);
    a ValueError naming any parameter that is missing."""
    missing = [n for n in order if n not in hashes]
    if missing:
        raise ValueError(f"no hash for {missing[:3]}{'...' if len(missing) > 3 else ''}; "
                         "valid: one hash per parameter of the model")
    return hashlib.sha256("".join(hashes[n] for n in order).encode()).hexdigest()


def parameter_names(model: LMConfig, moe: MoEShape | None = None) -> list[str]:
    """The small Llama's parameter names (its MoE variant's with ``moe``), in its own order
    (built on the meta device: no weights are drawn)."""
    return [name for name, _ in model_structure(model, moe).named_parameters()]


def gathered_fingerprint(module: torch.nn.Module, order: list[str], group=None) -> str:
    """Collective over ``group``: every stage's hashes, gathered, as one fingerprint."""
    mine = parameter_hashes(module.named_parameters())
    every: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    return fingerprint({k: v for part in every for k, v in part.items()}, order)
