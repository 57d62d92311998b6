"""Run a function as several ranks of a real gloo process group, as threads of this process.

A check in a notebook cannot launch ``torchrun`` on a class the learner just typed: the
new processes would not have it. Threads can: each thread builds its own
``ProcessGroupGloo`` over a shared in-memory store, and ``dist.all_reduce(t, group=pg)``
really communicates (over loopback sockets), exactly as between processes. Only the
launch differs.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _world


def gloo_group(store: dist.Store, rank: int, world_size: int,
               timeout: float) -> dist.ProcessGroup:
    """A gloo group as ``init_process_group`` builds one: a ``ProcessGroup`` in front of the
    gloo backend, so that its collectives pass through PyTorch's dispatcher (where
    ``helpers.comm.meter.CommMeter`` counts them)."""
    backend = dist.ProcessGroupGloo(store, rank, world_size, datetime.timedelta(seconds=timeout))
    group = dist.ProcessGroup(store, rank, world_size)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    return group


def run_ranks(world_size: int, work: Callable[[int, object], object],
              timeout: float = 60.0, raise_errors: bool = False) -> list[object]:
    """``work(rank, group)`` on ``world_size`` threads; each rank's result, or its exception.
    With ``raise_errors``, the first failed rank's exception (the lowest rank's) is raised
    instead of returned."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size!r}; valid: an integer >= 1")
    store = dist.HashStore()
    results: list[object] = [None] * world_size

    def rank_main(rank: int) -> None:
        try:
            group = gloo_group(store, rank, world_size, timeout)
            results[rank] = work(rank, group)
        except BaseException as error:  # handed to the caller, which reports it
            results[rank] = error

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True)
               for r in range(world_size)]
    for thread in threads:
        thread.start()
    for rank, thread in enumerate(threads):
        thread.join(timeout + 5)
        if thread.is_alive():
            results[rank] = TimeoutError(f"rank {rank} did not finish within {timeout:g} s "
                                         "(a collective that the other ranks never joined?)")
    if raise_errors:
        for result in results:
            if isinstance(result, BaseException):
                raise result
    return results


def mesh_groups(rank: int, shape: dict[str, int], store: dist.Store,
                timeout: float = 60.0) -> dict[str, dist.ProcessGroup]:
    """This rank's group along each dimension of a mesh of ``shape`` (outermost first, the
    last dimension innermost: neighbours), each a gloo group over its own store prefix."""
    names, sizes = list(shape), list(shape.values())
    coords, left = [], rank
    for size in reversed(sizes):
        coords.insert(0, left % size)
        left //= size
    groups = {}
    for axis, name in enumerate(names):
        stride = 1
        for size in sizes[axis + 1:]:
            stride *= size
        first = rank - coords[axis] * stride  # the member of this line with coordinate 0
        line = f"{name}:{first}"
        groups[name] = gloo_group(dist.PrefixStore(line, store), coords[axis], sizes[axis],
                                  timeout)
    return groups


def run_mesh(shape: dict[str, int], work: Callable[[int, dict], object],
             timeout: float = 60.0, raise_errors: bool = False) -> list[object]:
    """``work(rank, groups)`` on one thread per rank of a mesh of ``shape`` (e.g.
    ``{"cp": 2, "tp": 2}``, the last dimension innermost); ``groups`` maps each dimension
    to this rank's group along it. Each rank's result, or its exception (``raise_errors``:
    as ``run_ranks``)."""
    world = 1
    for name, size in shape.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{name}={size!r}; valid: an integer >= 1")
        world *= size
    store = dist.HashStore()
    return run_ranks(world, lambda rank, _: work(rank, mesh_groups(rank, shape, store, timeout)),
                     timeout, raise_errors)


@contextlib.contextmanager
def registered(group: object) -> Iterator[None]:
    """Let calls that map ranks through the groups ``new_group`` records (``dist.send``,
    ``recv``, ``broadcast``, DDP) use a group built here: for the block, its ranks are
    recorded as the world's (private torch state: ``_world.pg_group_ranks``)."""
    _world.pg_group_ranks[group] = {r: r for r in range(group.size())}
    try:
        yield
    finally:
        _world.pg_group_ranks.pop(group, None)
