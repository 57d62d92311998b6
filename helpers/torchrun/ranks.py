"""The worker side of a ``torchrun`` launch: this rank, its process group, its result.

Device and backend come from ``helpers.core.devices.plan_devices``: NCCL with one GPU
per rank, else gloo on the CPU.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import NoReturn

import torch
import torch.distributed as dist

from helpers.core.devices import plan_devices
from helpers.core.errors import NotUnderTorchrunError
from helpers.core.files import atomic_write_json
from helpers.torchrun.lifeline import die_with_parent

RESULT_ENV = "TUTORIAL_RESULT_FILE"
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def torchrun_world_size(module: str) -> int:
    """``WORLD_SIZE`` set by torchrun; a one-line error saying how to launch ``module`` if not."""
    missing = [v for v in TORCHRUN_VARS if v not in os.environ]
    if missing:
        raise NotUnderTorchrunError(
            f"{module} is one rank of a torchrun launch, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set; launch it with "
            f"`torchrun --nproc-per-node=2 -m {module} ...` (or helpers.torchrun.launcher.run_module)"
        )
    return int(os.environ["WORLD_SIZE"])


@dataclass(frozen=True)
class Rank:
    """This process's place in the launch, or in a group of its first ranks (``first_ranks``)."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    reason: str
    group: dist.ProcessGroup | None = None  # the collectives' group; None: the whole world


def init_rank(module: str = "this module", *, device: str = "auto", backend: str = "auto") -> Rank:
    """Join the process group that ``torchrun`` set up (env:// rendezvous).

    The rank first asks to be killed when its torchrun agent dies, so that no rank
    outlives a launch whose agent was killed (``helpers.torchrun.lifeline``).
    """
    world_size = torchrun_world_size(module)
    die_with_parent()
    local_rank = int(os.environ["LOCAL_RANK"])
    plan = plan_devices(world_size, processes=True, device=device, backend=backend)
    local = plan.devices[0]
    if plan.backend == "nccl":
        local = torch.device("cuda", local_rank)
        torch.cuda.set_device(local)
    dist.init_process_group(
        backend=plan.backend, device_id=local if plan.backend == "nccl" else None,
        **attempt_store(world_size),
    )
    return Rank(
        dist.get_rank(), dist.get_world_size(), local_rank, local, plan.backend, plan.reason
    )


def attempt_store(world_size: int) -> dict:
    """The agent's store, under a prefix of its own for this attempt, when torchrun has one.

    After ``--max-restarts`` brings a launch back, the agent's store (``MASTER_ADDR:
    MASTER_PORT``) still holds the keys that the killed attempt's ranks wrote: gloo's
    peer addresses among them. Without a prefix per attempt, a new rank can read a dead
    peer's address before the new one overwrites it, and fail with "Connection refused".
    Empty (the usual env:// rendezvous) when torchrun does not share its store, and on
    several nodes: each node's agent counts only the restarts of its own ranks, so the
    count is not a name that every node would agree on.
    """
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if not shared or os.environ.get("GROUP_WORLD_SIZE", "1") != "1":
        return {}
    from datetime import timedelta

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timedelta(minutes=10))
    return {"store": dist.PrefixStore(f"attempt_{attempt}", store),
            "rank": int(os.environ["RANK"]), "world_size": world_size}


@contextmanager
def process_group(
    module: str = "this module", *, device: str = "auto", backend: str = "auto"
) -> Iterator[Rank]:
    """``init_rank`` for the body of a ``with``; the process group is destroyed on the way out."""
    rank = init_rank(module, device=device, backend=backend)
    try:
        yield rank
    finally:
        dist.destroy_process_group()


def first_ranks(rank: Rank, sizes: Sequence[int]) -> dict[int, Rank | None]:
    """For each size p, this rank as a member of the group of ranks 0 .. p-1 (None if outside).

    Collective: every rank of the world calls it with the same sizes, since
    ``dist.new_group`` is. The whole world keeps the default group; a smaller p gets its
    own, in which rank r of the world is rank r of the group.
    """
    places: dict[int, Rank | None] = {}
    for p in sizes:
        if not 1 <= p <= rank.world_size:
            raise ValueError(f"group of {p} ranks; valid: 1 .. {rank.world_size} (the world size)")
        group = None if p == rank.world_size else dist.new_group(list(range(p)))
        if rank.rank >= p:
            places[p] = None
        elif group is None:
            places[p] = rank
        else:  # as the group sees it: its size, and this rank in it (rank r of the world is r)
            size, mine = dist.get_world_size(group), dist.get_rank(group)
            places[p] = replace(rank, rank=mine, world_size=size, group=group)
    return places


def max_over_ranks(value: float, rank: Rank) -> float:
    """The largest ``value`` of the rank's group, on every rank of it (on the rank's device,
    as NCCL needs)."""
    t = torch.tensor([value], dtype=torch.float64, device=rank.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=rank.group)
    return t.item()


def write_result(rank: Rank, result: dict) -> None:
    """Rank 0 hands its JSON result to the launcher (atomically); other ranks do nothing."""
    path = os.environ.get(RESULT_ENV)
    if rank.rank == 0 and path:
        atomic_write_json(path, result)


def exit_worker(code: int) -> NoReturn:
    """End a worker process with ``code`` now, skipping the interpreter's teardown.

    With torch imported, Python's own teardown takes most of a second per process, and
    torchrun waits for every rank's. By then the rank has destroyed its process group,
    written its result and printed its last line; only the output buffers remain, flushed here.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
