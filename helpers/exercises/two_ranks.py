"""Run a function as several ranks of a real gloo process group, as threads of this process.

A check in a notebook cannot launch ``torchrun`` on a class the learner just typed: the
new processes would not have it. Threads can: each thread builds its own
``ProcessGroupGloo`` over a shared in-memory store, and ``dist.all_reduce(t, group=pg)``
really communicates (over loopback sockets), exactly as between processes. Only the
launch differs.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable

import torch.distributed as dist


def run_ranks(world_size: int, work: Callable[[int, object], object],
              timeout: float = 60.0) -> list[object]:
    """``work(rank, group)`` on ``world_size`` threads; each rank's result, or its exception."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size!r}; valid: an integer >= 1")
    store = dist.HashStore()
    results: list[object] = [None] * world_size

    def rank_main(rank: int) -> None:
        try:
            group = dist.ProcessGroupGloo(store, rank, world_size,
                                          datetime.timedelta(seconds=timeout))
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
    return results
