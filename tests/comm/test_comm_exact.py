"""Lesson 06's collectives to the letter: the ring and gloo byte formulas against a table
worked by hand for N = 1 to 4 ranks, gloo's header pieces rank by rank, the all-to-all's
blocks, the alpha-beta fit, what each collective leaves on each rank, and what the meter
charges to each group and collective, untimed at the dispatcher and timed at the doors."""

from __future__ import annotations

import math
import warnings
from collections import Counter

import numpy as np
import pytest
import torch
import torch.distributed as dist

from helpers.comm import calls
from helpers.comm.calls import C10D_OPS, DIST, FUNCOL, Tally, call_bytes
from helpers.comm.collectives import (
    COLLECTIVES,
    AlphaBeta,
    all_gather,
    all_to_all_sent,
    expected_result,
    fit_alpha_beta,
    gloo_bytes,
    rank_input,
    reduce_scatter,
    ring_bytes,
    run_collective,
    validate_collective,
)
from helpers.comm.headers import (
    HEADER,
    MAX_SEGMENT,
    allreduce_pieces,
    broadcast_pieces,
    gloo_header_bytes,
)
from helpers.comm.meter import CommMeter
from helpers.torchrun.in_notebook import registered, run_ranks

S = 12  # bytes: divides by 1, 2, 3 and 4 ranks


# -- the formulas, by hand ------------------------------------------------------------------
def test_ring_bytes_for_one_to_four_ranks_by_hand():
    """(N - 1)/N x 12 B per pass: 0, 6, 8, 9; an all-reduce twice that; a broadcast 12 B."""
    table = {"all_reduce": [0, 12, 16, 18], "reduce_scatter": [0, 6, 8, 9],
             "all_gather": [0, 6, 8, 9], "broadcast": [0, 12, 12, 12]}
    for name, row in table.items():
        got = [ring_bytes(name, n, S) for n in (1, 2, 3, 4)]
        assert got == row, name
        assert all(type(b) is float for b in got), name
    assert validate_collective("broadcast") == "broadcast"


def test_ring_bytes_refuse_a_world_size_that_is_not_a_positive_integer():
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match=rf"^world_size={bad!r}; valid: an integer >= 1$"):
            ring_bytes("all_reduce", bad, S)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^unknown collective 'gather'; valid choices: "
                                         r"all_reduce, reduce_scatter, all_gather, broadcast$"):
        validate_collective("gather")


def test_gloo_bytes_by_hand_rank_by_rank():
    """gloo: a reduce-scatter sends an all-reduce's bytes; a broadcast is a binomial tree
    (the root's virtual rank is 0; in round i the ranks below 2^i send 2^i up)."""
    assert [gloo_bytes("reduce_scatter", n, S) for n in (1, 2, 3, 4)] == [0, 12, 16, 18]
    assert [gloo_bytes("all_reduce", n, S) for n in (1, 2, 3, 4)] == [0, 12, 16, 18]
    assert [gloo_bytes("all_gather", n, S) for n in (1, 2, 3, 4)] == [0, 6, 8, 9]
    tree = {(1, 0): [0], (2, 0): [12, 0], (3, 0): [24, 0, 0], (4, 0): [24, 12, 0, 0],
            (2, 1): [0, 12], (3, 1): [0, 24, 0], (3, 2): [0, 0, 24],
            (4, 2): [0, 0, 24, 12], (4, 3): [12, 0, 0, 24],
            (5, 0): [36, 12, 0, 0, 0], (6, 0): [36, 24, 0, 0, 0, 0]}
    for (n, root), row in tree.items():
        got = [gloo_bytes("broadcast", n, S, r, root) for r in range(n)]
        assert got == row, (n, root)
        assert all(type(b) is float for b in got)
    assert gloo_bytes("broadcast", 4, S, 1) == 12  # root 0 by default


def test_gloo_bytes_refuse_ranks_and_roots_outside_the_group():
    for rank, root in ((4, 0), (-1, 0), (0, 4), (0, -1)):
        with pytest.raises(ValueError, match=rf"^rank={rank}, root={root}; valid: 0 to 3$"):
            gloo_bytes("broadcast", 4, S, rank, root)
    with pytest.raises(ValueError, match=r"^world_size=0; valid"):
        gloo_bytes("broadcast", 0, S)
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        gloo_bytes("gather", 2, S)


def test_header_pieces_rank_by_rank_by_hand():
    """gloo's ring: k N segments (k >= 2, each <= 1 MiB, whole elements); empty segments
    are skipped. 12 B over 3 ranks: six 4-byte segments, three of them empty."""
    assert [allreduce_pieces(3, 12, r) for r in range(3)] == [(4, 3), (3, 5), (5, 4)]
    assert [gloo_header_bytes("all_reduce", 3, 12, r) for r in range(3)] == [528, 528, 672]
    assert [gloo_header_bytes("reduce_scatter", 3, 12.0, r) for r in range(3)] == [
        528, 528, 672]  # a float size is a whole number of bytes
    # 6 B of 2-byte elements on 2 ranks: four 2-byte segments, three with data
    assert [allreduce_pieces(2, 6, r, 2) for r in range(2)] == [(3, 3), (3, 3)]
    assert gloo_header_bytes("all_reduce", 2, 6, 1, element_size=2) == 432
    assert [allreduce_pieces(2, 6, r) for r in range(2)] == [(2, 2), (2, 2)]  # 4-byte elements
    # 7 MiB on 3 ranks: 7 segments of at most 1 MiB, rounded up to 9; 6 sent per pass
    assert [allreduce_pieces(3, 7 * MAX_SEGMENT, r) for r in range(3)] == [(12, 12)] * 3
    assert allreduce_pieces(2, 0, 0) == allreduce_pieces(1, 8, 0) == (0, 0)
    assert gloo_header_bytes("all_reduce", 2, 0) == 0
    assert all(gloo_header_bytes(c, 1, S) == 0 for c in COLLECTIVES)
    assert gloo_header_bytes("all_gather", 3, S, 2) == 4 * 3 * HEADER  # 4 sent, 4 received
    assert [broadcast_pieces(4, r, root=3) for r in range(4)] == [(1, 1), (0, 1), (0, 1), (2, 0)]
    assert broadcast_pieces(1, 0) == (0, 0)
    assert [gloo_header_bytes("broadcast", 4, 8, r, root=3) for r in range(4)] == [
        144, 48, 48, 192]
    assert gloo_header_bytes("broadcast", 4, 8, 3) == 48  # root 0: rank 3 a leaf


# -- the all-to-all and the alpha-beta fit ----------------------------------------------------
def test_an_all_to_all_sends_each_block_but_its_own_bytes():
    one_row = torch.zeros(1, 3)  # 12 B
    assert all_to_all_sent(one_row, [1, 0], 1, 2) == 12
    assert all_to_all_sent(torch.zeros(6, 2, dtype=torch.float16), [], 2, 3) == 4 * 4
    assert all_to_all_sent(torch.zeros(6, 2, dtype=torch.int64), [1, 2, 3], 0, 3) == 5 * 16
    assert all_to_all_sent(torch.tensor(3.0), [1], 0, 1) == 0  # a scalar is one row
    assert all_to_all_sent(torch.zeros(0, 3), [], 1, 2) == 0
    with pytest.raises(ValueError, match=r"^splits=\[2, 2\] do not cut 5 rows into 2 blocks$"):
        all_to_all_sent(torch.zeros(5), [], 0, 2)
    with pytest.raises(ValueError, match=r"^splits=\[1, 1\] do not cut 2 rows into 3 blocks$"):
        all_to_all_sent(torch.zeros(2), [1, 1], 0, 3)


def test_alpha_beta_predicts_and_its_residuals_by_hand():
    fit = AlphaBeta("all_gather", 1.0, 0.5, [2.0, 4.0], [2.5, 2.0])
    assert fit.bandwidth == 2.0 and fit.predict(10.0) == 6.0
    assert fit.residuals == [0.5, -1.0] and fit.relative_residuals == [0.2, -0.5]
    assert AlphaBeta("x", 1.0, 0.0, [], []).bandwidth == math.inf
    assert AlphaBeta("x", 1.0, -1.0, [], []).bandwidth == math.inf


def test_the_fit_weights_each_size_by_one_over_its_time():
    """Off a line, the 1/t-weighted least squares (numpy's polyfit with weights 1/t)."""
    sent, times = [0, 1000, 2000, 8000], [0.1, 3.0, 2.0, 9.0]
    fit = fit_alpha_beta("broadcast", sent, times)
    beta, alpha = np.polyfit(sent, times, 1, w=1 / np.asarray(times))
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-9)
    assert fit.beta_s_per_byte == pytest.approx(beta, rel=1e-9)
    unweighted = np.polyfit(sent, times, 1)
    assert abs(fit.alpha_s - unweighted[1]) > 0.5  # the weights matter here
    assert fit.collective == "broadcast" and fit.sent_bytes == [0.0, 1000.0, 2000.0, 8000.0]
    assert all(type(b) is float for b in fit.sent_bytes) and fit.times_s == times
    assert type(fit.alpha_s) is float and type(fit.beta_s_per_byte) is float
    two = fit_alpha_beta("x", [1.0, 3.0], [2.0, 4.0])  # two sizes: the line through them
    assert (two.alpha_s, two.beta_s_per_byte) == pytest.approx((1.0, 1.0))
    for sizes, times_s, words in (([1.0], [1.0], "1 sizes and 1 times"),
                                  ([1.0, 2.0], [1.0], "2 sizes and 1 times"),
                                  ([1.0], [1.0, 2.0], "1 sizes and 2 times")):
        with pytest.raises(ValueError, match=rf"^{words}; valid: the same number of each, "
                                             "at least 2$"):
            fit_alpha_beta("x", sizes, times_s)


# -- what each collective leaves on each rank -------------------------------------------------
HAND = {  # 3 ranks, 6 elements: rank r holds 0..5 + 1000 r
    "all_reduce": [[3000, 3003, 3006, 3009, 3012, 3015]] * 3,
    "reduce_scatter": [[3000, 3003], [3006, 3009], [3012, 3015]],
    "all_gather": [[0, 1, 1002, 1003, 2004, 2005]] * 3,
    "broadcast": [[0, 1, 2, 3, 4, 5]] * 3,
}


def test_the_expected_results_by_hand():
    inputs = [rank_input(r, 6) for r in range(3)]
    assert inputs[2].tolist() == [2000, 2001, 2002, 2003, 2004, 2005]
    assert inputs[0].dtype == torch.float32
    for name, rows in HAND.items():
        for rank in range(3):
            assert expected_result(name, inputs, rank).tolist() == rows[rank], (name, rank)
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        expected_result("gather", inputs, 0)


def test_each_collective_leaves_on_three_thread_ranks_what_the_hand_table_says():
    def work(rank, group):
        with registered(group):
            return {name: run_collective(name, rank_input(rank, 6), rank, 3, group)
                    for name in COLLECTIVES}

    for rank, got in enumerate(run_ranks(3, work, timeout=30, raise_errors=True)):
        for name, rows in HAND.items():
            assert got[name].tolist() == rows[rank], (name, rank)
            assert got[name].dtype == torch.float32
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        run_collective("gather", torch.ones(2), 0, 1)


def test_the_one_tensor_collectives_use_torchs_current_names():
    """No deprecation warning: all_gather_single and reduce_scatter_single, not the old."""
    def work(rank, group):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = torch.empty(4)
            all_gather(out, torch.full((2,), float(rank)), group=group)
            mine = torch.empty(1)
            reduce_scatter(mine, torch.arange(2.0) + 10 * rank, group=group)
        return out.tolist(), mine.tolist()

    assert run_ranks(2, work, timeout=30, raise_errors=True) == [
        ([0, 0, 1, 1], [10.0]), ([0, 0, 1, 1], [12.0])]


# -- the meter ------------------------------------------------------------------------------
def test_a_charge_adds_to_its_group_and_its_collective():
    """gloo's bytes default to the ring's; no calls, bytes or seconds: nothing added."""
    meter = CommMeter()
    meter.charge("dp", "all_reduce", 10.0)
    meter.charge("dp", "broadcast", 4.0, 0.5, gloo=8.0)
    meter.charge("pp", "p2p", None, 0.25, calls=0)
    meter.charge("pp", "all_reduce", 1.0, calls=2, gloo=0.0)
    assert isinstance(meter.per_group, Tally) and isinstance(meter.per_collective, Tally)
    assert meter.per_group.calls == Counter(dp=2, pp=2)
    assert meter.per_group.ring == Counter(dp=14.0, pp=1.0)
    assert meter.per_group.gloo == Counter(dp=18.0, pp=0.0)
    assert meter.per_group.seconds == Counter(dp=0.5, pp=0.25)
    assert meter.per_collective.calls == Counter(all_reduce=3, broadcast=1)
    assert "p2p" not in meter.per_collective.ring and "p2p" not in meter.per_collective.calls
    assert (meter.total_ring, meter.total_gloo, meter.total_seconds) == (15.0, 18.0, 0.75)
    assert type(meter.total_ring) is float and type(meter.total_seconds) is float
    assert meter.group_name(object()) == "other"  # type: ignore[arg-type]  # no groups named


def test_call_bytes_and_the_tables_of_names():
    assert call_bytes(torch.ones(3)) == 12
    assert call_bytes([torch.ones(2), torch.ones(3, dtype=torch.float16)]) == 14
    assert call_bytes((torch.ones(1), None, 3)) == 4 and call_bytes(None) == 0
    assert C10D_OPS["_reduce_scatter_base_"] == ("reduce_scatter", 1)
    assert C10D_OPS["reduce_scatter_tensor_coalesced_"] == ("reduce_scatter", 1)
    assert C10D_OPS["allgather_into_tensor_coalesced_"] == ("all_gather", 0)
    assert DIST["reduce_scatter"] == ("reduce_scatter", 1) and DIST["barrier"] == ("barrier", None)
    assert FUNCOL == {"all_gather_single": ("all_gather", 2),
                      "reduce_scatter_single": ("reduce_scatter", 3),
                      "all_reduce": ("all_reduce", 2)}
    assert calls.group_root(None, {"group_src": 2}) == 2  # type: ignore[arg-type]


def _issue_every_form(rank: int, group) -> None:
    """12 B of each collective, in every form the meter names (3 ranks, 4 B a chunk)."""
    dist.all_reduce(torch.ones(3), group=group)
    reduce_scatter(torch.empty(1), torch.ones(3), group=group)
    all_gather(torch.empty(3), torch.ones(1), group=group)
    dist.broadcast(torch.ones(3), src=1, group=group)  # rank 1 is the root
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.reduce_scatter_tensor(torch.empty(1), torch.ones(3), group=group)
        dist.all_gather_into_tensor(torch.empty(3), torch.ones(1), group=group)
        with dist._coalescing_manager(group=group):
            dist.reduce_scatter_tensor(torch.empty(1), torch.ones(3), group=group)
        with dist._coalescing_manager(group=group):
            dist.all_gather_into_tensor(torch.empty(3), torch.ones(1), group=group)


# per rank of 3: ring 8 B a pass, 16 an all-reduce, 12 a broadcast; gloo's reduce-scatter 16
CALLS = {"all_reduce": 1, "reduce_scatter": 3, "all_gather": 3, "broadcast": 1}
RING = {"all_reduce": 16.0, "reduce_scatter": 24.0, "all_gather": 24.0, "broadcast": 12.0}


def _gloo(rank: int) -> dict[str, float]:
    return {"all_reduce": 16.0, "reduce_scatter": 48.0, "all_gather": 24.0,
            "broadcast": [0.0, 24.0, 0.0][rank]}


def test_the_meter_at_the_dispatcher_charges_every_form_on_three_ranks():
    def work(rank, group):
        with registered(group):
            with CommMeter({"dp": group}) as named, CommMeter() as unnamed:
                _issue_every_form(rank, group)
                dist.barrier(group=group)  # a c10d operator the meter does not charge
            return named, unnamed

    for rank, (named, unnamed) in enumerate(run_ranks(3, work, timeout=30,
                                                        raise_errors=True)):
        assert dict(named.per_collective.calls) == CALLS
        assert dict(named.per_collective.ring) == RING
        assert dict(named.per_collective.gloo) == _gloo(rank), rank
        assert named.per_group.calls == Counter(dp=8) and named.per_group.ring["dp"] == 76.0
        assert named.total_gloo == sum(_gloo(rank).values())
        assert unnamed.per_group.calls == Counter(other=8)


def test_the_timed_meter_charges_every_form_once_at_the_doors():
    """Process-wide: the three thread ranks' calls add up; an old name calling its new one
    is one call; the list forms and a barrier are charged too."""
    def work(rank, group):
        with registered(group):
            _issue_every_form(rank, group)
            dist.all_gather([torch.empty(1) for _ in range(3)], torch.ones(1), group=group)
            dist.reduce_scatter(torch.empty(1), [torch.ones(1)] * 3, group=group)
            dist.broadcast(torch.ones(3), group_src=2, group=group, async_op=True).wait()
            dist.barrier(group=group)

    originals = [getattr(dist, name) for name in DIST]
    with CommMeter(timed=True) as clock:
        run_ranks(3, work, timeout=30, raise_errors=True)
    assert [getattr(dist, name) for name in DIST] == originals  # put back
    tally = clock.per_collective
    assert dict(tally.calls) == {"all_reduce": 3, "reduce_scatter": 12, "all_gather": 12,
                                 "broadcast": 6, "barrier": 3}
    assert dict(tally.ring) == {"all_reduce": 48.0, "reduce_scatter": 96.0,
                                "all_gather": 96.0, "broadcast": 72.0, "barrier": 0.0}
    # gloo: the reduce-scatters twice the ring; each broadcast's root sends 24 B
    assert dict(tally.gloo) == {"all_reduce": 48.0, "reduce_scatter": 192.0,
                                "all_gather": 96.0, "broadcast": 48.0, "barrier": 0.0}
    assert set(tally.seconds) == set(tally.calls) and all(tally.seconds.values())


def test_edge_cases_of_the_formulas_by_hand():
    """Uneven chunks, 1-byte elements, a tree of 9 ranks, int results, one rank's inputs."""
    # 20 B of 4-byte elements on 2 ranks: four 8-byte segments, the last one empty
    assert [allreduce_pieces(2, 20, r) for r in range(2)] == [(3, 3), (3, 3)]
    # 5 B of 1-byte elements: segments of 2 B, the third holds the last byte
    assert [allreduce_pieces(2, 5, r, 1) for r in range(2)] == [(3, 3), (3, 3)]
    assert gloo_header_bytes("all_reduce", 4, 4) == 144  # rank 0 by default
    assert [broadcast_pieces(3, r) for r in range(3)] == [(2, 0), (0, 1), (0, 1)]
    assert [broadcast_pieces(9, r)[0] for r in range(9)] == [4, 2, 1, 1, 0, 0, 0, 0, 0]
    assert type(all_to_all_sent(torch.zeros(3, 2), [], 0, 3)) is int
    one = [rank_input(0, 2)]
    assert all(expected_result(c, one, 0).tolist() == [0, 1] for c in COLLECTIVES)


def test_the_root_of_a_broadcast_and_a_float64_reduce_scatter_on_thread_ranks():
    def work(rank, group):
        with registered(group):
            roots = [calls.group_root(group, {"src": 2}), calls.group_root(group, {"src": None}),
                     calls.group_root(group, {})]
            full = torch.arange(6, dtype=torch.float64) * (rank + 1)
            got = run_collective("reduce_scatter", full, rank, 3, group)
        return roots, got.dtype, got.tolist()

    results = run_ranks(3, work, timeout=30, raise_errors=True)
    assert [r[0] for r in results] == [[2, 0, 0]] * 3
    assert [r[1:] for r in results] == [(torch.float64, [0.0, 6.0]),
                                        (torch.float64, [12.0, 18.0]),
                                        (torch.float64, [24.0, 30.0])]


def test_the_timed_meter_charges_an_all_to_all_and_a_pipeline_wait():
    from torch.distributed.pipelining import schedules

    def work(rank, group):
        with registered(group):
            dist.all_to_all_single(torch.empty(3), torch.ones(3), group=group)
        return None

    with CommMeter(timed=True) as clock:
        run_ranks(3, work, timeout=30, raise_errors=True)
    assert clock.per_collective.calls["all_to_all"] == 3
    assert clock.per_collective.ring["all_to_all"] == 3 * 8.0  # 2 of 3 rows of 4 B each
    for groups, where in (({"pp": None}, "pp"), ({}, "other")):
        meter = CommMeter(timed=True)
        meter.groups = groups  # (only its name is read)
        with meter:
            schedules._wait_batch_p2p([])
        assert set(meter.per_group.seconds) == {where} and not meter.per_group.calls
        assert set(meter.per_collective.seconds) == {"p2p"}


# -- roots, named groups, and the timed doors of DTensor's and the pipeline's calls ----------
def test_a_broadcasts_root_is_mapped_through_its_groups_ranks(monkeypatch):
    """``src`` is a global rank: group ranks {4: 0, 0: 1, 6: 2} map it; no src is global 0."""
    from torch.distributed.distributed_c10d import _world

    group = object()
    monkeypatch.setitem(_world.pg_group_ranks, group, {4: 0, 0: 1, 6: 2})
    assert calls.group_root(group, {"src": 6}) == 2  # type: ignore[arg-type]
    assert calls.group_root(group, {"src": None}) == 1  # type: ignore[arg-type]
    assert calls.group_root(group, {"group_src": 0, "src": 6}) == 0  # type: ignore[arg-type]


def test_a_dispatched_root_is_the_broadcasts_and_zero_for_the_rest():
    c10d = torch.ops.c10d
    assert calls.dispatched_root(c10d.allreduce_.default, ()) == 0
    names = [a.name for a in c10d.broadcast_.default._schema.arguments]
    args = [None] * len(names)
    args[names.index("root_rank")] = 2
    assert calls.dispatched_root(c10d.broadcast_.default, tuple(args)) == 2


def test_gloo_broadcast_defaults_to_rank_0_the_root_and_a_tree_of_nine():
    """Rank 0 (the default) is the default root: 2 children of 4 ranks. Nine ranks: the
    root sends in rounds 1, 2, 4, 8; virtual rank 1 in rounds 2 and 4; 2 and 3 in round 4."""
    assert gloo_bytes("broadcast", 4, S) == 24
    assert [gloo_bytes("broadcast", 9, S, r) for r in range(9)] == [
        48, 24, 12, 12, 0, 0, 0, 0, 0]


def test_the_untimed_meter_names_an_all_to_alls_and_a_sends_group():
    """Rank 0 sends 20 B to rank 1, which sends 12 B back; a receive is not charged."""
    def work(rank, group):
        splits_in, splits_out = [[1, 3], [2, 2]][rank], [[1, 2], [3, 2]][rank]
        out = torch.empty(sum(splits_out), 2)
        with registered(group), CommMeter({"ep": group}, sends=True) as meter:
            dist.all_to_all_single(out, torch.ones(4, 2), splits_out, splits_in, group=group)
            works = [group.send([torch.ones([5, 3][rank])], 1 - rank, 0),
                     group.recv([torch.empty([3, 5][rank])], 1 - rank, 0)]
            for w in works:
                w.wait()
        return meter

    for rank, meter in enumerate(run_ranks(2, work, timeout=30, raise_errors=True)):
        a2a, sent = [24.0, 16.0][rank], [20.0, 12.0][rank]
        assert dict(meter.per_collective.calls) == {"all_to_all": 1, "p2p": 1}
        assert dict(meter.per_collective.ring) == {"all_to_all": a2a, "p2p": sent}
        assert dict(meter.per_group.calls) == {"ep": 2}
        assert dict(meter.per_group.ring) == {"ep": a2a + sent}


def test_the_timed_meter_charges_functional_collectives_and_pipeline_batches():
    """Two ranks, rank 0's meter named ``pp`` (the other rank's group has the same ranks):
    DTensor's three functional collectives, and a pipeline batch of two sends (12 + 16 B)
    against two receives, each batch one call (its sends are not charged again)."""
    import threading

    from torch._C._distributed_c10d import _register_process_group, _unregister_process_group
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed.pipelining import schedules

    both = threading.Barrier(2, timeout=10)

    def issue(rank, group):
        gathered = funcol.all_gather_single(torch.full((2,), float(rank)), 0, group)
        mine = funcol.reduce_scatter_single(torch.arange(4.0) + rank, "sum", 0, group=group)
        summed = funcol.all_reduce(torch.full((3,), rank + 1.0), "sum", group)
        tensors = [torch.ones(3), torch.ones(2, dtype=torch.float64)]
        if rank == 0:
            ops = [dist.P2POp(dist.isend, t, group=group, group_peer=1) for t in tensors]
        else:
            tensors = [torch.empty_like(t) for t in tensors]
            ops = [dist.P2POp(dist.irecv, t, group=group, group_peer=0) for t in tensors]
        assert schedules._batch_p2p([]) == []
        schedules._wait_batch_p2p(schedules._batch_p2p(ops))
        return [torch.as_tensor(t).tolist() for t in (gathered, mine, summed, *tensors)]

    def work(rank, group):
        name = f"thread-pp-{id(group)}"
        group._set_group_name(name)
        _register_process_group(name, group)
        try:
            with registered(group):
                if rank == 1:
                    both.wait()
                    got = issue(rank, group)
                    both.wait()
                    return got, None
                try:
                    with CommMeter({"pp": group}, timed=True) as meter:
                        both.wait()
                        got = issue(rank, group)
                        both.wait()
                except BaseException:
                    both.abort()  # rank 1 stops waiting for a meter that never came
                    raise
                return got, meter
        finally:
            _unregister_process_group(name)

    results = run_ranks(2, work, timeout=10, raise_errors=True)
    assert [got for got, _ in results] == [
        [[0, 0, 1, 1], [1, 3], [3, 3, 3], [1, 1, 1], [1, 1]],
        [[0, 0, 1, 1], [5, 7], [3, 3, 3], [1, 1, 1], [1, 1]]]
    meter = results[0][1]
    tally = meter.per_collective
    # per rank: all-gather of 16 B and reduce-scatter of 16 B, 8 B each by the ring (gloo's
    # reduce-scatter 16); all-reduce of 12 B, 12 B; rank 0's batch 28 B, rank 1's none
    assert dict(tally.calls) == {"all_gather": 2, "reduce_scatter": 2, "all_reduce": 2,
                                 "p2p": 2}
    assert dict(tally.ring) == {"all_gather": 16.0, "reduce_scatter": 16.0,
                                "all_reduce": 24.0, "p2p": 28.0}
    assert dict(tally.gloo) == {"all_gather": 16.0, "reduce_scatter": 32.0,
                                "all_reduce": 24.0, "p2p": 28.0}
    assert set(tally.seconds) == set(tally.calls) and all(tally.seconds.values())
    assert dict(meter.per_group.calls) == {"pp": 8}
    assert dict(meter.per_group.ring) == {"pp": 84.0}
    assert dict(meter.per_group.gloo) == {"pp": 100.0}
    assert set(meter.per_group.seconds) == {"pp"}


def test_the_one_tensor_collectives_fall_back_to_the_older_names(monkeypatch):
    """A stand-in ``dist``: the current names where torch has them, else the older ones."""
    from helpers.comm import collectives

    class Dist:
        def __init__(self, new: bool) -> None:
            self.called: list[tuple[str, object]] = []
            names = ["all_gather_into_tensor", "reduce_scatter_tensor"]
            if new:
                names += ["all_gather_single", "reduce_scatter_single"]
            for name in names:
                setattr(self, name, lambda out, inp, n=name, **kw: self.called.append((n, kw)))

    for new, used in ((True, ["all_gather_single", "reduce_scatter_single"]),
                      (False, ["all_gather_into_tensor", "reduce_scatter_tensor"])):
        fake = Dist(new)
        monkeypatch.setattr(collectives, "dist", fake)
        all_gather(torch.empty(2), torch.ones(1), group="g")
        reduce_scatter(torch.empty(1), torch.ones(2), group="g")
        assert fake.called == [(used[0], {"group": "g"}), (used[1], {"group": "g"})]


def test_a_group_is_named_by_itself_else_by_its_ranks_else_other(monkeypatch):
    """Stand-in groups: ``dp`` spans global ranks {0, 2}; another group over the same ranks
    is ``dp`` too; a group over {1, 3} is ``other``. Seconds of one key add up."""
    from torch.distributed.distributed_c10d import _world

    class Group:
        def __init__(self, name: str) -> None:
            self.group_name = name

    dp, same, odd = Group("g0"), Group("g1"), Group("g2")
    for group, ranks in ((dp, {0: 0, 2: 1}), (same, {2: 1, 0: 0}), (odd, {1: 0, 3: 1})):
        monkeypatch.setitem(_world.pg_group_ranks, group, ranks)
    meter = CommMeter({"dp": dp})  # type: ignore[dict-item]
    assert [meter.group_name(g) for g in (dp, same, odd)] == [  # type: ignore[arg-type]
        "dp", "dp", "other"]
    meter.charge("dp", "all_reduce", 1.0, 0.25)
    meter.charge("dp", "all_reduce", 2.0, 0.5)
    assert meter.per_group.seconds == Counter(dp=0.75)
    assert meter.per_collective.seconds == Counter(all_reduce=0.75)


def test_one_timed_rank_passes_every_door_and_each_is_put_back():
    """One rank (nothing to wait for): each door wraps its function inside the ``with``,
    counts its call, and the module or class holds its own function again after it."""
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed.pipelining import schedules

    doors = [(dist, name) for name in DIST] + [(funcol, name) for name in FUNCOL] + [
        (schedules, "_batch_p2p"), (schedules, "_wait_batch_p2p"),
        (dist, "all_to_all_single")]
    before = [vars(owner)[name] for owner, name in doors]
    send = vars(dist.ProcessGroup)["send"]

    def work(rank, group):
        with registered(group):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                dist.all_reduce(torch.ones(2), group=group)
                dist.broadcast(torch.ones(2), src=0, group=group)
                dist.all_gather_single(torch.empty(2), torch.ones(2), group=group)
                dist.all_gather_into_tensor(torch.empty(2), torch.ones(2), group=group)
                dist.all_gather([torch.empty(2)], torch.ones(2), group=group)
                dist.reduce_scatter_single(torch.empty(2), torch.ones(2), group=group)
                dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2), group=group)
                dist.reduce_scatter(torch.empty(2), [torch.ones(2)], group=group)
                dist.barrier(group=group)
            dist.all_to_all_single(torch.empty(2), torch.ones(2), group=group)
            schedules._wait_batch_p2p(schedules._batch_p2p([]))
            return [vars(owner)[name] for owner, name in doors]

    with CommMeter(timed=True) as clock:
        (inside,) = run_ranks(1, work, timeout=10, raise_errors=True)
        assert vars(dist.ProcessGroup)["send"] is not send
    assert all(a is not b for a, b in zip(inside, before, strict=True))
    assert [vars(owner)[name] for owner, name in doors] == before
    assert vars(dist.ProcessGroup)["send"] is send and not clock._saved
    assert dict(clock.per_collective.calls) == {
        "all_reduce": 1, "broadcast": 1, "all_gather": 3, "reduce_scatter": 3, "barrier": 1,
        "all_to_all": 1}
    assert set(clock.per_collective.seconds) == {*clock.per_collective.calls, "p2p"}
    assert clock.total_ring == clock.total_gloo == 0.0  # one rank sends nothing
