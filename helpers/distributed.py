"""The worker side of a ``torchrun`` launch: backend choice, process group, result file.

NCCL needs one GPU per rank (it refuses two ranks on one GPU: "Duplicate GPU
detected"); without enough GPUs the ranks use gloo on the CPU, one thread each.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from helpers.files import atomic_write_json

RESULT_ENV = "TUTORIAL_RESULT_FILE"
BACKEND_CHOICES = ("auto", "gloo", "nccl")


def choose_backend(world_size: int, requested: str = "auto") -> tuple[str, str]:
    """(backend, reason) for ``world_size`` ranks on this machine."""
    if requested not in BACKEND_CHOICES:
        raise ValueError(f"unknown backend {requested!r}; valid choices: {BACKEND_CHOICES}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "nccl":
        if gpus < world_size:
            valid = (
                f"world size <= {gpus}, or backend 'gloo' (CPU)" if gpus else "backend 'gloo' (CPU)"
            )
            raise ValueError(
                f"backend 'nccl' needs one GPU per rank: world size {world_size} but {gpus} GPU(s). "
                f"NCCL refuses two ranks on one GPU ('Duplicate GPU detected'); valid: {valid}"
            )
        return "nccl", f"nccl: one GPU per rank ({world_size} of {gpus} GPUs)"
    if requested == "gloo":
        return "gloo", "gloo on the CPU, as requested"
    if gpus >= world_size:
        return "nccl", f"nccl: one GPU per rank ({world_size} of {gpus} GPUs)"
    if gpus:
        return "gloo", (
            f"gloo on the CPU: {world_size} ranks but only {gpus} GPU(s), and NCCL refuses two "
            "ranks on one GPU ('Duplicate GPU detected')"
        )
    return "gloo", "gloo on the CPU: this machine has no CUDA GPU"


@dataclass(frozen=True)
class Rank:
    """This process's place in the launch."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def init_rank(backend: str = "auto") -> Rank:
    """Join the process group that ``torchrun`` set up (env:// rendezvous)."""
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend, _ = choose_backend(world_size, backend)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    return Rank(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)


@contextmanager
def process_group(backend: str = "auto") -> Iterator[Rank]:
    """``init_rank`` for the body of a ``with``; the process group is destroyed on the way out."""
    rank = init_rank(backend)
    try:
        yield rank
    finally:
        dist.destroy_process_group()


def max_over_ranks(value: float, rank: Rank) -> float:
    """The largest ``value`` of all ranks, on every rank (on the rank's device, as NCCL needs)."""
    t = torch.tensor([value], dtype=torch.float64, device=rank.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def write_result(rank: Rank, result: dict) -> None:
    """Rank 0 hands its JSON result to the launcher (atomically); other ranks do nothing."""
    path = os.environ.get(RESULT_ENV)
    if rank.rank == 0 and path:
        atomic_write_json(path, result)
