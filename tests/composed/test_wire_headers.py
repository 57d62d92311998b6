"""gloo's headers per call, read from the sockets of real gloo ranks: the allowance lesson 12's
wire verdict grants (``results.HEADER_BYTES``), on 2 ranks and, N - 1 times over, on 4."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers.comm.collectives import all_gather, gloo_bytes, reduce_scatter
from helpers.comm.wire import WireMeter, wire_unavailable
from helpers.runs.llama_3d.results import HEADER_BYTES

SIZES = (64, 65536)  # bytes of the full tensor: both below gloo's 1 MiB segment


def _headers(rank: int, world: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dist.all_reduce(torch.ones(1))  # connections warmed up
    seen = {}
    for size in SIZES:
        full = torch.ones(size // 8, dtype=torch.float64)
        chunk = full[:full.numel() // world].clone()
        for name in ("all_reduce", "reduce_scatter", "all_gather", "p2p"):
            dist.barrier()
            wire = WireMeter()
            with wire:
                if name == "all_reduce":
                    dist.all_reduce(full.clone())
                elif name == "reduce_scatter":
                    reduce_scatter(torch.empty_like(chunk), full.clone())
                elif name == "all_gather":
                    all_gather(torch.empty_like(full), chunk)
                elif rank < 2:  # rank 0 sends to rank 1
                    (dist.send if rank == 0 else dist.recv)(full.clone(), 1 - rank)
            payload = gloo_bytes(name, world, size) if name != "p2p" else size * (rank == 0)
            seen[size, name] = wire.sent - payload
    out[rank] = seen
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.skipif(wire_unavailable() is not None, reason=str(wire_unavailable()))
@pytest.mark.parametrize("world", [2, 4])
def test_gloo_headers_per_call_are_what_the_wire_verdict_allows(world):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_headers, args=(world, port, out), nprocs=world, join=True)
        seen = {rank: dict(out[rank]) for rank in range(world)}
    for size in SIZES:
        for rank in range(world):
            for name in ("all_reduce", "reduce_scatter", "all_gather"):
                assert seen[rank][size, name] == HEADER_BYTES[name] * (world - 1), (rank, size)
        # a send: its notice and its preamble; a receive: its notice (48 B each)
        assert (seen[0][size, "p2p"], seen[1][size, "p2p"]) == (96, 48)
        assert 96 + 48 <= HEADER_BYTES["p2p"]
