"""The meter's all-to-all (even and uneven) and its opt-in point-to-point sends."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from helpers.comm.collectives import all_to_all_sent
from helpers.comm.meter import ALL_TO_ALL, P2P, CommMeter
from helpers.torchrun.in_notebook import run_ranks


def test_an_all_to_all_sends_every_block_but_its_own():
    rows = torch.zeros(10, 3, dtype=torch.float32)  # 12 bytes a row
    assert all_to_all_sent(rows, [], 0, 2) == 5 * 12
    assert all_to_all_sent(rows, [1, 6, 3], 1, 3) == 4 * 12
    with pytest.raises(ValueError, match="do not cut 10 rows into 3 blocks"):
        all_to_all_sent(rows, [1, 2, 3], 0, 3)


def test_uneven_all_to_all_and_sends_counted_on_real_ranks():
    def work(rank, group):
        splits_in = [[1, 3], [2, 2]][rank]  # what rank sends to 0 and to 1
        splits_out = [[1, 2], [3, 2]][rank]  # what it receives from 0 and from 1
        x = torch.ones(4, 2)
        out = torch.empty(sum(splits_out), 2)
        with CommMeter(sends=True) as counted, CommMeter() as quiet:
            dist.all_to_all_single(out, x, splits_out, splits_in, group=group)
            works = [group.send([torch.ones(5)], 1 - rank, 0),
                     group.recv([torch.empty(5)], 1 - rank, 0)]
            for w in works:
                w.wait()
        return (counted.per_collective.ring[ALL_TO_ALL], counted.per_collective.ring[P2P],
                quiet.per_collective.calls[P2P])

    results = run_ranks(2, work, timeout=30)
    # rank 0 sends 3 rows of 8 B to rank 1; rank 1 sends 2 rows to rank 0; each 20 B p2p
    assert results == [(24.0, 20.0, 0), (16.0, 20.0, 0)]


def test_the_timed_meter_counts_a_ring_send_once_and_puts_the_method_back():
    """Timed, at the Python doors: ``ProcessGroup.send`` (a context-parallel ring's) is
    charged as one p2p call of its bytes; after the ``with`` the class holds its own
    method again, and a send still binds its group (a bare function would not)."""
    original = vars(dist.ProcessGroup)["send"]

    def work(rank, group):
        if rank == 1:  # only receives: the patch is process-wide, as timed mode says
            for _ in range(2):
                group.recv([torch.empty(5)], 0, 0).wait()
            return None
        with CommMeter(timed=True) as meter:  # (thread ranks' groups have no global name)
            group.send([torch.ones(5)], 1, 0).wait()
        group.send([torch.ones(5)], 1, 0).wait()  # after the with: the real method
        return meter.per_collective.calls[P2P], meter.per_collective.ring[P2P]

    assert run_ranks(2, work, timeout=30)[0] == (1, 20.0)
    assert vars(dist.ProcessGroup)["send"] is original
