"""Lesson 06's collectives on the ranks: each checked against its definition, timed at
several sizes, and the bytes one call of each put on this rank's sockets.

A timed round is ``collective_repeats`` calls back to back on buffers allocated once (as
nccl-tests times them: no call copies its input first), after warm-up calls and a barrier;
its time is divided by its calls. The bytes on the wire are read around one more call,
untimed: reading the sockets takes time of its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from helpers.comm.collectives import (
    COLLECTIVES,
    all_gather,
    expected_result,
    gloo_bytes,
    rank_input,
    reduce_scatter,
    ring_bytes,
    run_collective,
)
from helpers.comm.wire import WireMeter
from helpers.core.timing import synchronized_clock
from helpers.runs.data_parallel.config import DataParallelConfig
from helpers.runs.data_parallel.results import collective_check
from helpers.runs.data_parallel.traffic import CollectiveSize
from helpers.torchrun.ranks import Rank, max_over_ranks
from helpers.torchrun.status import say


def collective_call(name: str, world_size: int, nbytes: int, device,
                    group=None) -> Callable[[], object]:
    """One call of collective ``name`` on a tensor of ``nbytes``, on buffers allocated once
    (zeros: every sum stays exact), so that a timed call copies nothing of its own."""
    full = torch.zeros(max(world_size, nbytes // 4), device=device)
    chunk = torch.zeros(full.numel() // world_size, device=device)
    calls = {"all_reduce": lambda: dist.all_reduce(full, group=group),
             "reduce_scatter": lambda: reduce_scatter(chunk, full, group=group),
             "all_gather": lambda: all_gather(full, chunk, group=group),
             "broadcast": lambda: dist.broadcast(full, src=0, group=group)}
    return calls[name]


def collectives_section(rank: Rank, config: DataParallelConfig, wire: bool) -> dict:
    """What each collective computes (checked against a local computation); per size, its
    times (after warm-up calls, ``repeats`` rounds of ``collective_repeats`` calls back to
    back, each round's time divided by its calls), then, untimed, the bytes one more call
    put on this rank's sockets (if ``wire``)."""
    n, r, device = rank.world_size, rank.rank, rank.device
    checks = []
    say(rank, f"checking the {len(COLLECTIVES)} collectives")
    for name in COLLECTIVES:
        inputs = [rank_input(q, 4 * n) for q in range(n)]
        got = run_collective(name, inputs[r].to(device), r, n)
        wrong = (got.cpu() - expected_result(name, inputs, r)).abs().max().item()
        checks.append(collective_check(name, max_over_ranks(wrong, rank)))
    rows = []
    for k, name in enumerate(COLLECTIVES, 1):
        say(rank, f"timing {name} ({k} of {len(COLLECTIVES)})")
        for nbytes in config.collective_sizes:
            call = collective_call(name, n, nbytes, device)
            for _ in range(config.warmup):
                call()
            times = []  # per call, averaged over a round of back-to-back calls
            for _ in range(config.repeats):
                dist.barrier()
                start = synchronized_clock()
                for _ in range(config.collective_repeats):
                    call()
                times.append((synchronized_clock() - start) / config.collective_repeats)
            meter = WireMeter()
            if wire:
                with meter:  # a call of its own: reading the sockets is kept out of the clock
                    call()
            rows.append((name, 4 * max(n, nbytes // 4), times, meter.sent))
    wires = [[sent for *_, sent in rows]] * n
    if wire:
        dist.all_gather_object(wires, wires[0])
    sweep = [CollectiveSize(name, s, ring_bytes(name, n, s),
                            [gloo_bytes(name, n, s, q) for q in range(n)],
                            [wires[q][i] for q in range(n)] if wire else None, times)
             for i, (name, s, times, _) in enumerate(rows)]
    return {"collective_checks": checks, "sweep": sweep}
