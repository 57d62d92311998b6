"""What an expert-parallel rank of the MoE small Llama holds, measured in one AdamW step,
equals what ``helpers.expert_parallel.memory`` predicts from the shapes and the routing,
byte for byte: weights (its experts and the replicated rest), gradients, optimizer
state, and the bytes kept for backward, on 1 and 2 thread ranks, with and without
capacity dropping."""

from __future__ import annotations

import pytest
import torch

from helpers.expert_parallel.llama import (
    moe_layers,
    moe_llama,
)
from helpers.expert_parallel.memory import (
    LayerLoad,
    balanced_load,
    ep_rank_memory,
    parameter_counts,
)
from helpers.expert_parallel.moe import MoEShape
from helpers.models.llama import LMConfig
from helpers.runs.expert_parallel.thread_runs import memory_on_ranks

LM = LMConfig(vocab=40, hidden=16, blocks=2, ffn=32, heads=2, kv_heads=1, rope=True)
BATCH, SEQ = 4, 8


def _shape(capacity_factor: float | None, shared: bool = True) -> MoEShape:
    return MoEShape(hidden=16, ffn=24, experts=4, top_k=2, shared=shared,
                    capacity_factor=capacity_factor)


def _measure(shape: MoEShape, ep: int, model=None, shift: int = -1) -> list:
    """Each rank's (held, loads) after one AdamW step of ``model`` (default: built from
    ``shape``) on ep ranks; the targets are the ids rolled by ``shift``."""
    model = moe_llama(LM, shape, seed=0).double() if model is None else model
    ids = torch.randint(0, LM.vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    return memory_on_ranks(model, ids, torch.roll(ids, shift, 1), ep)


@pytest.mark.parametrize("ep", [1, 2])
@pytest.mark.parametrize("capacity_factor", [None, 0.75], ids=["all-kept", "dropping"])
def test_each_rank_holds_what_the_shapes_and_routing_predict(ep, capacity_factor):
    shape = _shape(capacity_factor)
    for measured, loads in _measure(shape, ep):
        predicted = ep_rank_memory(LM, shape, ep=ep, batch=BATCH // ep, seq=SEQ, loads=loads,
                                   optimizer="adam", precision="fp64")
        assert measured == predicted
        dropped = sum(sum(x.arrived) - sum(x.kept) for x in loads)
        assert (dropped > 0) == (capacity_factor is not None)


def test_without_a_shared_expert_and_with_an_expert_left_idle():
    """No shared expert; a router biased away from expert 3 leaves it without rows, so it
    has no gradient and no AdamW state."""
    shape = _shape(None, shared=False)
    model = moe_llama(LM, shape, seed=0).double()
    for layer in moe_layers(model):
        layer.router.bias[3] = -10.0  # never chosen
    for rank, (measured, loads) in enumerate(_measure(shape, 2, model, shift=0)):
        assert all((x.arrived[-1] == 0) == (rank == 1) for x in loads)
        assert measured == ep_rank_memory(LM, shape, ep=2, batch=BATCH // 2, seq=SEQ,
                                          loads=loads, optimizer="adam", precision="fp64")


def test_ep_divides_the_experts_weights_and_nothing_else():
    shape = _shape(None)
    one, two = (parameter_counts(LM, shape, ep) for ep in (1, 2))
    expert = 3 * shape.hidden * shape.ffn
    assert one["numel"] - two["numel"] == LM.blocks * 2 * expert
    assert one["numel"] == sum(p.numel() for p in moe_llama(LM, shape).parameters())


def test_a_balanced_router_is_the_plan_before_a_run():
    shape = _shape(0.75)
    load = balanced_load(16, shape, 2)  # 2 ranks x 16 tokens x 2 slots over 4 experts
    assert load == LayerLoad(16, (16, 16), (12, 12))  # capacity ceil(0.75 x 32 x 2 / 4)
    with pytest.raises(ValueError, match="valid: tokens x ep x top_k a multiple of E"):
        balanced_load(3, _shape(None), 1)
    with pytest.raises(ValueError, match="precision='mixed'; valid: 'fp32', 'fp64'"):
        ep_rank_memory(LM, shape, ep=2, batch=2, seq=SEQ, precision="mixed")
    with pytest.raises(ValueError, match=r"loads of \[16, 16\] tokens; valid: 8 each"):
        ep_rank_memory(LM, shape, ep=2, batch=1, seq=SEQ, loads=[load, load])
