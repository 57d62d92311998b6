"""Lesson 06's diagrams: drawn from the batch split, the estimator and a real ZeRO-3 step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.core.drawing import rank_colour
from helpers.core.sizes import format_bytes
from helpers.data_parallel.diagrams import (
    data_parallel_diagram,
    zero3_diagram,
    zero3_events,
    zero_holdings_diagram,
)
from helpers.data_parallel.fsdp import fsdp_units
from helpers.models.llama import build_lm, lm_config
from helpers.runs.data_parallel.traffic import PLANS

TINY = lm_config(vocab=64, hidden=16, blocks=2)


@pytest.mark.parametrize("n, batch", [(2, 4), (4, 8), (3, 3)])
def test_each_rank_gets_its_own_rows_and_one_all_reduce_averages(n, batch):
    d = data_parallel_diagram(n, batch)
    per = batch // n
    for r in range(n):
        rows = ", ".join(str(s) for s in range(r * per, (r + 1) * per))
        assert f"forward + backward on samples {rows}" in d.labels
        assert f"rank {r}" in d.labels
    samples = [b for b in d.boxes if b[1] == 5.6]  # the batch's row, in sample order
    assert [b[4] for b in samples] == [rank_colour(s // per) for s in range(batch)]
    assert sum("all-reduce" in lab and f"÷ {n}" in lab for lab in d.labels) == 1
    assert d.arrows == 3 * n  # each rank: its rows in, its gradient to the all-reduce, back


@pytest.mark.parametrize("n, batch, bad", [(2, 5, "batch=5"), (2, 18, "batch=18"),
                                           (1, 4, "world_size=1"), (5, 10, "world_size=5")])
def test_a_batch_that_does_not_split_is_refused_by_name(n, batch, bad):
    with pytest.raises(ValueError, match=bad):
        data_parallel_diagram(n, batch)


@pytest.mark.parametrize("n", [2, 4])
def test_each_stage_shards_one_more_kind_by_the_papers_bytes(n):
    model = build_lm(TINY)
    numel, tensors = sum(p.numel() for p in model.parameters()), len(list(model.parameters()))
    d = zero_holdings_diagram(model, n)
    weights, state = 4 * numel, 8 * numel + 4 * tensors  # float32 Adam: two moments, counters
    sharded_state = 8 * numel // n + 4 * tensors  # the step counters stay whole
    sizes = [lab for lab in d.labels if lab.endswith("B")]
    per_stage = [[weights, weights, state], [weights, weights, sharded_state],
                 [weights, weights // n, sharded_state], [weights // n, weights // n,
                                                          sharded_state]]
    want = [format_bytes(b) for stage in per_stage for b in stage for _ in range(n)]
    assert sorted(sizes) == sorted(want)
    dashed = [b for b in d.boxes if b[4] == "#FFFFFF"]  # what the other ranks hold
    assert len(dashed) == n * (0 + 1 + 2 + 3)
    own = [b for b in d.boxes if b[4] == rank_colour(0)]  # rank 0's colour: its own slices
    assert len(own) == n * (3 + 2 + 1 + 0) + (0 + 1 + 2 + 3)


def test_the_holdings_refuse_bad_input_by_name():
    with pytest.raises(ValueError, match="world_size=1"):
        zero_holdings_diagram(build_lm(TINY), 1)
    with pytest.raises(ValueError, match="no parameters"):
        zero_holdings_diagram(nn.ReLU(), 2)


def test_zero3_gathers_each_unit_twice_one_at_a_time_and_leaves_the_model_whole():
    model = build_lm(TINY).train()
    before = [p.detach().clone() for p in model.parameters()]
    ids = torch.randint(0, TINY.vocab, (2, 8), generator=torch.Generator().manual_seed(0))
    events = zero3_events(model, ids, ids)
    units = list(fsdp_units(model))
    gathers = [u for what, u in events if what == "gather"]
    assert gathers == units + units[::-1]  # forward in order, backward in reverse
    assert gathers.count(units[0]) == PLANS["ZeRO-3"].gathers  # the plan the launch checks
    assert [u for what, u in events if what == "reduce-scatter"] == units[::-1]
    whole = 0
    for what, _ in events:  # at most one unit's weights whole at any moment
        whole += {"gather": 1, "free": -1}.get(what, 0)
        assert whole in (0, 1)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    d = zero3_diagram(events)
    assert [lab for lab in d.labels if lab in units] == units
    assert d.labels.count("F") == d.labels.count("B") == d.labels.count("RS") == len(units)


@pytest.mark.parametrize("events, bad", [
    ([("free", "embed")], r"event \('free', 'embed'\) out of order"),
    ([("gather", "a"), ("gather", "b")], r"event \('gather', 'b'\) out of order"),
    ([("gather", "a")], "unit 'a' was gathered and never freed"),
    ([], "no events"),
])
def test_zero3_events_out_of_order_are_refused_by_name(events, bad):
    with pytest.raises(ValueError, match=bad):
        zero3_diagram(events)
