"""gloo's headers per call, read from the sockets of real gloo ranks: the allowance lesson 13's
wire verdict grants (``results.HEADER_BYTES``), on 2 ranks and, N - 1 times over, on 4; an
all-to-all's uneven blocks too, an empty one among them."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers.comm.collectives import all_gather, all_to_all_sent, gloo_bytes, reduce_scatter
from helpers.comm.wire import WireMeter, wire_unavailable
from helpers.runs.llama_3d.results import HEADER_BYTES

SIZES = (64, 65536)  # bytes of the full tensor: both below gloo's 1 MiB segment


def _measure(rank: int, world: int, group: dist.ProcessGroup, barrier) -> dict:
    """Each call's bytes on this rank's sockets less gloo's payload, on ``group`` of
    ``world`` ranks; rank 0 sends to rank 1 for the point-to-point case."""
    seen = {}
    for size in SIZES:
        full = torch.ones(size // 8, dtype=torch.float64)
        chunk = full[:full.numel() // world].clone()
        # an all-to-all's blocks: uneven, rank 1's to rank 0 empty (still announced)
        n = full.numel()
        splits = ([[n // 2, n - n // 2] + [0] * (world - 2), [0] * (world - 1) + [n]]
                  + [[n] + [0] * (world - 1)] * (world - 2))
        for name in ("all_reduce", "reduce_scatter", "all_gather", "p2p", "all_to_all"):
            barrier()
            wire = WireMeter()
            with wire:
                if name == "all_to_all":
                    got = torch.empty(sum(s[rank] for s in splits), dtype=torch.float64)
                    dist.all_to_all_single(got, full.clone(), [s[rank] for s in splits],
                                           splits[rank], group=group)
                elif name == "all_reduce":
                    dist.all_reduce(full.clone(), group=group)
                elif name == "reduce_scatter":
                    reduce_scatter(torch.empty_like(chunk), full.clone(), group=group)
                elif name == "all_gather":
                    all_gather(torch.empty_like(full), chunk, group=group)
                elif rank < 2:  # rank 0 sends to rank 1
                    (dist.send if rank == 0 else dist.recv)(full.clone(), 1 - rank, group=group)
            if name == "all_to_all":
                payload = all_to_all_sent(full, splits[rank], rank, world)
            else:
                payload = gloo_bytes(name, world, size) if name != "p2p" else size * (rank == 0)
            seen[size, name] = wire.sent - payload
    return seen


def _headers(rank: int, world: int, port: int, out: dict) -> None:
    """All ``world`` ranks measure on the whole group; then ranks 0 and 1 measure on a group
    of their own while the others wait at the final barrier (which sends nothing from ranks
    0 and 1 before they reach it)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    pair = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(1))  # connections warmed up
    out[rank, world] = _measure(rank, world, dist.group.WORLD, dist.barrier)
    if rank < 2:
        dist.all_reduce(torch.ones(1), group=pair)
        out[rank, 2] = _measure(rank, 2, pair, lambda: dist.barrier(group=pair))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def measured() -> dict:
    """One launch of 4 ranks: (rank, group size) -> {(size, call): header bytes}."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_headers, args=(4, port, out), nprocs=4, join=True)
        return {key: dict(value) for key, value in out.items()}


@pytest.mark.skipif(wire_unavailable() is not None, reason=str(wire_unavailable()))
@pytest.mark.parametrize("world", [2, 4])
def test_gloo_headers_per_call_are_what_the_wire_verdict_allows(world, measured):
    seen = {rank: measured[rank, world] for rank in range(world)}
    for size in SIZES:
        for rank in range(world):
            for name in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
                assert seen[rank][size, name] == HEADER_BYTES[name] * (world - 1), (rank, size)
        # a send: its notice and its preamble; a receive: its notice (48 B each)
        assert (seen[0][size, "p2p"], seen[1][size, "p2p"]) == (96, 48)
        assert 96 + 48 <= HEADER_BYTES["p2p"]
