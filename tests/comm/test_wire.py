"""The bytes on the wire, read from the kernel's socket counters, against what was sent:
exact on a plain socket pair, and on real gloo ranks the all-reduce and reduce-scatter
cases the lessons rest on (gloo's reduce-scatter sends an all-reduce's bytes)."""

from __future__ import annotations

import os
import socket
import threading

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers.comm.collectives import gloo_bytes, reduce_scatter, ring_bytes
from helpers.comm.headers import gloo_header_bytes
from helpers.comm.meter import CommMeter
from helpers.comm.wire import WireMeter, wire_unavailable

needs_counters = pytest.mark.skipif(wire_unavailable() is not None,
                                    reason=str(wire_unavailable()))


def _pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    return server, client, accepted


def _drain(sock: socket.socket, n: int) -> None:
    while n:
        n -= len(sock.recv(min(n, 1 << 16)))


@needs_counters
def test_a_socket_pair_counts_exactly_what_was_written_and_the_store_apart():
    server, client, accepted = _pair()
    payload = 1_000_003
    reader = threading.Thread(target=_drain, args=(accepted, payload))
    try:
        meter = WireMeter(store_ports=frozenset())
        reader.start()
        with meter:
            client.sendall(b"x" * payload)
            reader.join()
        # both ends live in this process: what one wrote, the other received
        assert (meter.sent, meter.received, meter.windows) == (payload, payload, 1)
        store = WireMeter(store_ports=frozenset({server.getsockname()[1]}))
        with store:
            accepted.sendall(b"y" * 4096)
            _drain(client, 4096)
        assert (store.sent, store.store_sent, store.store_received) == (0, 4096, 4096)
        with store:  # a second window adds to the first
            accepted.sendall(b"z" * 10)
            _drain(client, 10)
        assert (store.store_sent, store.windows) == (4106, 2)
    finally:
        for sock in (client, accepted, server):
            sock.close()


def test_gloo_broadcast_is_a_binomial_tree_and_its_reduce_scatter_an_all_reduce():
    assert [gloo_bytes("broadcast", 8, 1.0, r) for r in range(8)] == [3, 2, 1, 1, 0, 0, 0, 0]
    assert [gloo_bytes("broadcast", 5, 1.0, r, root=2) for r in range(5)] == [0, 0, 3, 1, 0]
    assert gloo_bytes("reduce_scatter", 4, 8.0) == ring_bytes("all_reduce", 4, 8.0) == 12
    assert gloo_bytes("reduce_scatter", 4, 8.0) == 2 * ring_bytes("reduce_scatter", 4, 8.0)
    assert gloo_bytes("all_gather", 4, 8.0) == ring_bytes("all_gather", 4, 8.0) == 6
    with pytest.raises(ValueError, match="valid: 0 to 3"):
        gloo_bytes("broadcast", 4, 8.0, rank=4)


S = 4 * 2**20  # 4 MiB of float32 on 2 ranks


def _rank(rank: int, world: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    full = torch.ones(S // 4)
    dist.all_reduce(full.clone())  # connections warmed up
    seen = {}
    for name in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
        meter = CommMeter()
        with meter:
            if name == "all_reduce":
                dist.all_reduce(full.clone())
            elif name == "reduce_scatter":
                reduce_scatter(torch.empty(full.numel() // world), full.clone())
            elif name == "all_gather":
                dist.all_gather_into_tensor(torch.empty_like(full),
                                            full[:full.numel() // world].clone())
            else:
                dist.broadcast(full.clone(), src=0)
        seen[name] = (meter.wire.sent, meter.total_ring, meter.total_gloo,
                      meter.wire.store_sent)
    out[rank] = seen
    dist.barrier()
    dist.destroy_process_group()


@needs_counters
def test_gloo_ranks_send_what_gloo_bytes_says_and_a_reduce_scatter_twice_the_ring():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(2, port, out), nprocs=2, join=True)
        seen = dict(out)
    for rank in (0, 1):
        for name, (wire, _ring, gloo, store) in seen[rank].items():
            # exactly gloo's payload plus its headers, counted from its algorithms
            assert wire == gloo + gloo_header_bytes(name, 2, S, rank), (rank, name, wire, gloo)
            assert store == 0, (rank, name, store)
        wire, ring, gloo, _ = seen[rank]["reduce_scatter"]
        assert ring == S / 2 and gloo == S and wire >= 1.9 * ring  # not the ring's bytes
        assert seen[rank]["all_reduce"][:3] == (seen[rank]["all_reduce"][0], S, S)
    assert [seen[r]["broadcast"][2] for r in (0, 1)] == [S, 0]
