"""The one-device MoE layer: routing, gates, capacity, the load-balancing loss and its
refusals; and its output equals a token-by-token sum of its experts."""

from __future__ import annotations

import pytest
import torch

from helpers.expert_parallel.moe import (
    MoEFFN,
    MoEShape,
    Router,
    capacity,
    keep_within_capacity,
    load_balancing_loss,
)

SHAPE = MoEShape(hidden=8, ffn=12, experts=4, top_k=2)


def _tokens(n: int = 32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, SHAPE.hidden, generator=g, dtype=torch.float64)


def test_router_picks_the_top_k_and_its_gates_sum_to_one():
    torch.manual_seed(0)
    routing = Router(SHAPE, torch.float64)(_tokens())
    assert routing.experts.shape == (32, 2) and routing.kept.all()
    assert torch.equal(routing.experts, routing.probs.topk(2, dim=-1).indices)
    assert torch.allclose(routing.gates.sum(-1), torch.ones(32, dtype=torch.float64),
                          atol=1e-15, rtol=0)
    assert torch.allclose(routing.probs.sum(-1), torch.ones(32, dtype=torch.float64),
                          atol=1e-15, rtol=0)
    assert (routing.gates[:, 0] >= routing.gates[:, 1]).all()  # best slot first


def test_the_bias_changes_the_choice_but_not_the_gates():
    torch.manual_seed(0)
    router = Router(SHAPE, torch.float64)
    x = _tokens()
    before = router(x)
    router.bias[3] = 10.0  # expert 3 wins every token
    after = router(x)
    assert (after.experts[:, 0] == 3).all() and not torch.equal(before.experts, after.experts)
    assert torch.equal(after.probs, before.probs)
    chosen = after.probs.gather(1, after.experts)
    assert torch.equal(after.gates, chosen / chosen.sum(-1, keepdim=True))


def test_capacity_keeps_each_experts_first_assignments_in_token_then_slot_order():
    experts = torch.tensor([[0, 1], [1, 0], [0, 2], [1, 0]])
    kept = keep_within_capacity(experts, 2, 3)
    assert kept.tolist() == [[True, True], [True, True], [False, True], [False, False]]
    assert keep_within_capacity(experts, None, 3).all()
    shape = MoEShape(hidden=8, ffn=8, experts=4, top_k=2, capacity_factor=1.25)
    assert capacity(10, shape) == 7  # ceil(1.25 x 10 x 2 / 4)
    assert capacity(10, SHAPE) is None


def test_the_aux_loss_is_one_for_a_uniform_router_and_larger_when_skewed():
    x = _tokens()
    router = Router(SHAPE, torch.float64)
    with torch.no_grad():
        router.gate.weight.zero_()  # every probability 1/E
    routing = router(x)
    uniform = load_balancing_loss(routing.probs, routing.experts, SHAPE.experts)
    assert uniform.item() == pytest.approx(1.0, abs=1e-15)
    with torch.no_grad():
        router.gate.weight[0] = 5 * x.mean(0)  # expert 0 favoured
    skewed = router(x)
    assert load_balancing_loss(skewed.probs, skewed.experts, SHAPE.experts).item() > 1.1
    everything_on_0 = torch.zeros(32, 4, dtype=torch.float64)
    everything_on_0[:, 0] = 1.0
    top1 = torch.zeros(32, 1, dtype=torch.long)
    assert load_balancing_loss(everything_on_0, top1, 4).item() == 4.0  # the most: E


@pytest.mark.parametrize("shared", [False, True])
def test_the_layer_is_the_gate_weighted_sum_of_each_tokens_experts(shared):
    torch.manual_seed(0)
    shape = MoEShape(hidden=8, ffn=12, experts=4, top_k=2, shared=shared, capacity_factor=0.75)
    moe = MoEFFN(shape, torch.float64)
    x = _tokens(24).view(2, 12, 8)  # (batch, seq, hidden)
    out, aux = moe(x)
    routing = moe.last_routing
    assert out.shape == x.shape and aux.dim() == 0 and not routing.kept.all()
    tokens = x.reshape(-1, 8)
    for t in range(len(tokens)):
        want = moe.shared(tokens[t]) if shared else torch.zeros(8, dtype=torch.float64)
        for j in range(2):
            if routing.kept[t, j]:  # a dropped assignment adds nothing
                e = str(int(routing.experts[t, j]))
                want = want + routing.gates[t, j] * moe.experts[e](tokens[t])
        assert torch.allclose(out.reshape(-1, 8)[t], want, atol=1e-14, rtol=0)


def test_the_experts_keep_their_global_names():
    names = dict(MoEFFN(MoEShape(8, 12, 4, 1, shared=True)).named_parameters())
    assert {"router.gate.weight", "experts.3.down_proj.weight", "shared.up_proj.weight"} \
        <= set(names)
    assert names["experts.0.gate_proj.weight"].shape == (12, 8)


@pytest.mark.parametrize("bad, message", [
    (dict(experts=0), "experts=0; valid: an integer >= 1"),
    (dict(top_k=0), "top_k=0; valid: an integer from 1 to experts=4"),
    (dict(top_k=5), "top_k=5; valid: an integer from 1 to experts=4"),
    (dict(capacity_factor=0.0), "capacity_factor=0.0; valid: a number > 0, or None"),
    (dict(capacity_factor=-1), "capacity_factor=-1; valid"),
])
def test_bad_shapes_are_refused_naming_the_value_and_the_choices(bad, message):
    fields = dict(hidden=8, ffn=12, experts=4, top_k=2) | bad
    with pytest.raises(ValueError, match=message):
        MoEShape(**fields).validate()
    with pytest.raises(ValueError, match=message):
        MoEFFN(MoEShape(**fields))
