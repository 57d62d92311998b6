"""The bytes each rank's all-to-alls send in a step, counted on the ranks by CommMeter,
equal the prediction from the routing alone, forward and backward, balanced or skewed."""

from __future__ import annotations

import pytest
import torch

from helpers.comm.meter import ALL_TO_ALL, CommMeter
from helpers.expert_parallel.dispatch import ExpertParallelMoE
from helpers.expert_parallel.moe import MoEFFN, MoEShape
from helpers.expert_parallel.traffic import ep_traffic, routing_matrix
from helpers.torchrun.in_notebook import run_ranks

SHAPE = MoEShape(hidden=8, ffn=12, experts=8, top_k=2, capacity_factor=1.0)


def _counted(ep: int, skew: float):
    torch.manual_seed(0)
    moe = MoEFFN(SHAPE, torch.float64)
    moe.router.bias[0] = skew  # expert 0, on rank 0, takes more
    x = torch.randn(ep * 12, SHAPE.hidden, dtype=torch.float64)

    def work(rank, group):
        layer = ExpertParallelMoE(moe, group)
        mine = x.chunk(ep)[rank].clone().requires_grad_()  # as a layer's input in a model
        with CommMeter() as forward:
            out, aux = layer(mine)
        with CommMeter() as backward:
            (out.square().sum() + aux).backward()
        return forward, backward, layer.last_splits.counts

    results = run_ranks(ep, work, timeout=60)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


@pytest.mark.parametrize("skew", [0.0, 0.5], ids=["as-routed", "skewed"])
@pytest.mark.parametrize("ep", [2, 4])
def test_each_rank_sends_what_the_routing_predicts(ep, skew):
    results = _counted(ep, skew)
    matrix = routing_matrix(torch.stack([r[2] for r in results]))
    assert matrix.sum() == ep * 12 * SHAPE.top_k
    for rank, (forward, backward, _) in enumerate(results):
        want = ep_traffic(matrix, rank, SHAPE.hidden, 8, SHAPE.experts)
        assert forward.per_collective.ring[ALL_TO_ALL] == want.all_to_all_forward
        assert backward.per_collective.ring[ALL_TO_ALL] == want.all_to_all_backward
        assert forward.per_collective.calls[ALL_TO_ALL] == 3  # counts, dispatch, combine
        assert backward.per_collective.calls[ALL_TO_ALL] == 2
        assert forward.per_collective.ring["all_reduce"] == want.totals
    if skew:
        assert matrix[:, 0].sum() > matrix[:, 1:].sum(0).max()  # rank 0 receives the most


def test_a_balanced_routing_sends_all_but_ones_own_share():
    matrix = routing_matrix(torch.full((4, 8), 6))  # every rank: 6 rows to each expert
    t = ep_traffic(matrix, 1, hidden=16, element_bytes=4, experts=8)
    assert t.dispatch == t.combine == 3 * 12 * 16 * 4  # 12 rows to each of 3 other ranks
    assert t.counts == 3 * 2 * 8 and t.all_to_all == t.counts + 4 * t.dispatch
    assert ep_traffic(routing_matrix(torch.full((1, 8), 6)), 0, 16, 4, 8).all_to_all == 0


def test_bad_routing_input_is_refused():
    with pytest.raises(ValueError, match="experts=6 is not divisible by ep=4"):
        routing_matrix(torch.ones(4, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="rank=2; valid: 0 to 1"):
        ep_traffic(torch.ones(2, 2, dtype=torch.long), 2, 8, 8, 4)
