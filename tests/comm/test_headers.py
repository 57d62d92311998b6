"""gloo's message headers, counted from its algorithms (48 bytes a message: two per piece
sent, one per piece received), against what torch 2.14.1's gloo wrote on these sockets."""

from __future__ import annotations

import pytest

from helpers.comm.headers import (
    PER_RECEIVE,
    PER_SEND,
    broadcast_pieces,
    gloo_header_bytes,
    p2p_header_bytes,
    wire_within,
)


def test_ring_all_reduce_pieces_and_their_headers():
    assert [gloo_header_bytes("all_reduce", 2, s) for s in (256, 4 * 2**20, 20 * 2**20)] == [
        576, 576, 2880]  # 2 segments per rank, then 1 MiB segments: 10 per rank
    assert [gloo_header_bytes("all_reduce", 4, 4, r) for r in range(4)] == [144, 192, 288, 240]
    assert gloo_header_bytes("reduce_scatter", 4, 20 * 2**20) == 4320  # an all-reduce on gloo
    assert gloo_header_bytes("all_reduce", 1, 4096) == 0


def test_all_gather_broadcast_and_point_to_point():
    assert gloo_header_bytes("all_gather", 4, 1024) == 864
    assert [gloo_header_bytes("broadcast", 2, 8, r) for r in (0, 1)] == [96, 48]  # measured
    assert [broadcast_pieces(8, r) for r in range(8)] == [
        (3, 0), (2, 1), (1, 1), (1, 1), (0, 1), (0, 1), (0, 1), (0, 1)]
    assert (PER_SEND, PER_RECEIVE) == (96, 48)
    assert p2p_header_bytes(4, 4) == 576  # a pipeline rank's step in lesson 04
    with pytest.raises(ValueError, match="valid choices"):
        gloo_header_bytes("all_to_all", 2, 8)


def test_the_wire_verdict_is_the_payload_up_to_its_headers():
    assert wire_within(100, 100.0, 10) and wire_within(110, 100.0, 10)
    assert wire_within(99, 100.0, 10) is False and wire_within(111, 100.0, 10) is False
    assert wire_within(None, 100.0, 10) is None  # not read: nothing judged
