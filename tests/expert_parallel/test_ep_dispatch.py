"""Expert parallelism on real gloo ranks (threads) equals one device within the derived
float64 bound: the output, the auxiliary loss (summed over ranks), the input's gradient,
the router's and shared expert's gradients (summed over ranks, as a training step does)
and each expert's gradient on the rank that holds it; top-1 and top-2, with and without
capacity dropping, on 2 and 4 ranks. A planted wrong un-permutation fails by far."""

from __future__ import annotations

import pytest
import torch

from helpers.expert_parallel import dispatch as dispatch_module
from helpers.expert_parallel.bounds import bound_ratios, moe_bounds
from helpers.expert_parallel.dispatch import (
    ExpertParallelMoE,
    expert_range,
    permute,
    unpermute,
)
from helpers.expert_parallel.moe import MoEFFN, MoEShape, Router
from helpers.runs.expert_parallel.thread_runs import layer_on_one_device, layer_on_ranks
from helpers.torchrun.in_notebook import run_ranks

HIDDEN, FFN, EXPERTS, SEQ = 16, 24, 8, 8


def _setup(top_k: int, capacity_factor: float | None, shared: bool, ep: int,
           scale: float = 1.0, seed: int = 0):
    torch.manual_seed(seed)
    shape = MoEShape(HIDDEN, FFN, EXPERTS, top_k, shared, capacity_factor)
    moe = MoEFFN(shape, torch.float64)
    g = torch.Generator().manual_seed(seed + 1)
    x = scale * torch.randn(2 * ep, SEQ, HIDDEN, generator=g, dtype=torch.float64)
    dout = torch.randn(2 * ep, SEQ, HIDDEN, generator=g, dtype=torch.float64)
    return moe, x, dout  # (batch, seq, hidden): rank r holds batch rows 2r and 2r + 1


def _one_device(moe: MoEFFN, x, dout) -> dict[str, torch.Tensor]:
    return layer_on_one_device(moe, x, dout)


def _expert_parallel(moe: MoEFFN, x, dout, ep: int):
    return layer_on_ranks(moe, x, dout, ep)


CASES = [(1, None, False), (1, 1.0, True), (2, None, True), (2, 1.0, False)]


@pytest.mark.parametrize("ep", [2, 4])
@pytest.mark.parametrize("top_k, capacity_factor, shared", CASES,
                         ids=["top1", "top1-capacity-shared", "top2-shared", "top2-capacity"])
def test_expert_parallel_equals_one_device_within_the_bound(top_k, capacity_factor, shared, ep):
    moe, x, dout = _setup(top_k, capacity_factor, shared, ep)
    want = _one_device(moe, x, dout)
    if capacity_factor is not None:
        assert not moe.last_routing.kept.all()  # something was dropped
    got, _ = _expert_parallel(moe, x, dout, ep)
    bounds = moe_bounds(moe, x, dout, ranks=ep)
    assert set(got) == set(want) == set(bounds)
    ratios = bound_ratios(got, want, bounds)
    assert max(ratios.values()) <= 1, {n: r for n, r in ratios.items() if r > 1}
    assert max(b.max().item() for b in bounds.values()) < 1e-9  # a bound, not a blanket


@pytest.mark.parametrize("scale", [0.1, 3.0])
def test_the_bound_holds_at_other_input_scales(scale):
    moe, x, dout = _setup(2, 1.25, True, 2, scale=scale, seed=3)
    got, _ = _expert_parallel(moe, x, dout, 2)
    ratios = bound_ratios(got, _one_device(moe, x, dout), moe_bounds(moe, x, dout, ranks=2))
    assert max(ratios.values()) <= 1


def test_a_wrong_unpermutation_fails_the_bound_by_far(monkeypatch):
    """The permutation used where its inverse belongs sends results to the wrong tokens."""
    moe, x, dout = _setup(2, None, False, 2)
    want = _one_device(moe, x, dout)
    monkeypatch.setattr(dispatch_module, "undo_index", lambda order: order)
    got, _ = _expert_parallel(moe, x, dout, 2)
    ratios = bound_ratios(got, want, moe_bounds(moe, x, dout, ranks=2))
    assert ratios["out"] > 1e6 and ratios["input"] > 1e6


def test_the_recorded_splits_agree_between_ranks():
    moe, x, dout = _setup(2, None, False, 4)
    _, splits = _expert_parallel(moe, x, dout, 4)
    for r, mine in enumerate(splits):
        assert [s.received[r] for s in splits] == mine.sent  # what I sent, they received
        assert sum(mine.sent) == 2 * SEQ * 2 and mine.arrived.sum() == sum(mine.received)
        assert mine.kept.tolist() == mine.arrived.sum(0).tolist()  # no capacity: all kept


def test_permute_sorts_by_expert_and_unpermute_undoes_it():
    torch.manual_seed(0)
    x = torch.randn(10, HIDDEN, dtype=torch.float64)
    routing = Router(MoEShape(HIDDEN, FFN, EXPERTS, 2), torch.float64)(x)
    moved = permute(x, routing)
    flat = routing.experts.reshape(-1)
    assert torch.equal(flat[moved.order], flat[moved.order].sort().values)
    assert moved.counts.sum() == 20 and torch.equal(moved.counts, torch.bincount(flat, minlength=8))
    assert torch.equal(unpermute(moved.tokens, moved.order), x.repeat_interleave(2, dim=0))


def test_experts_the_ranks_cannot_divide_are_refused():
    valid = r"experts=6 is not divisible by ep=4; valid ep: \[1, 2, 3, 6\]"
    with pytest.raises(ValueError, match=valid):
        expert_range(6, 4, 0)
    moe = MoEFFN(MoEShape(HIDDEN, FFN, 6, 2))
    results = run_ranks(4, lambda rank, group: ExpertParallelMoE(moe, group), timeout=30)
    assert all(isinstance(r, ValueError) and "valid ep" in str(r) for r in results)
