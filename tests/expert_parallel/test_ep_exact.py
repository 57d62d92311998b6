"""Lesson 11's expert parallelism to the letter: the router's top-k and its bias, capacity
dropping in token order, the Switch Transformer load-balancing loss on a hand-worked case,
the expert split, permute and its inverse, the local experts' rows, the all-to-alls with
their gradients and the whole layer on 2 thread ranks against one device, the routing
matrix and each rank's bytes counted by hand, the load imbalance and DeepSeek-V3's bias
update, and the memory predictions against a real tiny model's tensors."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from helpers.expert_parallel.balance import imbalance, update_bias
from helpers.expert_parallel.bounds import U, bound_ratios, gamma, moe_bounds
from helpers.expert_parallel.dispatch import (
    ExpertParallelMoE,
    aux_share,
    combine,
    dispatch,
    exchange_counts,
    expert_range,
    global_counts,
    permute,
    run_local_experts,
    sum_replicated_grads,
    undo_index,
    unpermute,
)
from helpers.expert_parallel.llama import expert_parallel, moe_llama
from helpers.expert_parallel.memory import (
    LayerLoad,
    balanced_load,
    ep_rank_memory,
    held,
    layer_load,
    moe_saved_bytes,
    parameter_counts,
)
from helpers.expert_parallel.moe import (
    MoEFFN,
    MoEShape,
    Router,
    Routing,
    SwiGLU,
    capacity,
    keep_within_capacity,
    load_balancing_loss,
    make_experts,
)
from helpers.expert_parallel.traffic import COUNT_BYTES, ep_traffic, routing_matrix
from helpers.memory.estimate import estimate_transformer
from helpers.memory.ledger import DeviceMemory
from helpers.memory.transformer import TransformerShape
from helpers.models.llama import LMConfig
from helpers.torchrun.in_notebook import run_ranks

F64 = torch.float64


def _ranks(ep: int, work) -> list:
    return run_ranks(ep, work, timeout=30, raise_errors=True)


# --- the shape and the router --------------------------------------------------------------


@pytest.mark.parametrize("bad, message", [
    (dict(hidden=0), "hidden=0; valid: an integer >= 1"),
    (dict(ffn=True), "ffn=True; valid: an integer >= 1"),
    (dict(hidden=2.0), "hidden=2.0; valid: an integer >= 1"),
    (dict(top_k=True), "top_k=True; valid: an integer from 1 to experts=3"),
    (dict(top_k=1.0), "top_k=1.0; valid: an integer from 1 to experts=3"),
])
def test_each_size_is_refused_by_name(bad, message):
    """hidden, ffn and top_k are checked too, booleans and floats refused."""
    with pytest.raises(ValueError, match=message):
        MoEShape(**(dict(hidden=2, ffn=2, experts=3, top_k=2) | bad)).validate()


def test_the_smallest_valid_sizes_pass():
    """1 of everything, top_k = experts, and any positive capacity factor are valid."""
    shape = MoEShape(hidden=1, ffn=1, experts=1, top_k=1, capacity_factor=0.01)
    assert shape.validate() is shape
    assert MoEShape(2, 2, 3, 3, capacity_factor=None).validate().top_k == 3
    assert MoEShape(2, 2, 3, 1).shared is False and MoEShape(2, 2, 3, 1).capacity_factor is None


def _hand_router(bias=(0.0, 0.0, 0.0)) -> tuple[Router, torch.Tensor]:
    """3 experts whose logits are ``(x0, x1, -x1)``; token 0 is ``(ln 4, ln 2)``: probabilities
    (8, 4, 1)/13; token 1 is ``(0, ln 4)``: probabilities (4, 16, 1)/21."""
    router = Router(MoEShape(hidden=2, ffn=2, experts=3, top_k=2), F64)
    with torch.no_grad():
        router.gate.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, -1.0]]))
        router.bias.copy_(torch.tensor(bias))
    return router, torch.tensor([[math.log(4), math.log(2)], [0.0, math.log(4)]], dtype=F64)


def test_the_router_keeps_the_two_best_and_renormalises_their_gates():
    router, x = _hand_router()
    routing = router(x)
    want_p = torch.tensor([[8 / 13, 4 / 13, 1 / 13], [4 / 21, 16 / 21, 1 / 21]], dtype=F64)
    assert torch.allclose(routing.probs, want_p, atol=1e-15, rtol=0)
    assert routing.experts.tolist() == [[0, 1], [1, 0]]
    want_g = torch.tensor([[2 / 3, 1 / 3], [4 / 5, 1 / 5]], dtype=F64)
    assert torch.allclose(routing.gates, want_g, atol=1e-15, rtol=0)
    assert routing.kept.dtype == torch.bool and routing.kept.tolist() == [[True] * 2] * 2
    assert routing.gates.dtype == F64 and router.gate.weight.dtype == F64


def test_the_bias_is_added_to_choose_and_the_gates_ignore_it():
    """Bias 0.5 on expert 2: token 0 scores (8/13, 4/13, 1/13 + 1/2), so it takes 0 and 2,
    gates 8/9, 1/9; token 1 (4/21, 16/21, 1/21 + 1/2) takes 1 and 2, gates 16/17, 1/17."""
    router, x = _hand_router((0.0, 0.0, 0.5))
    routing = router(x)
    assert routing.experts.tolist() == [[0, 2], [1, 2]]
    want_g = torch.tensor([[8 / 9, 1 / 9], [16 / 17, 1 / 17]], dtype=F64)
    assert torch.allclose(routing.gates, want_g, atol=1e-15, rtol=0)
    assert torch.allclose(routing.probs.sum(-1), torch.ones(2, dtype=F64), atol=1e-15, rtol=0)
    assert dict(router.named_buffers())["bias"].shape == (3,)
    assert [n for n, _ in router.named_parameters()] == ["gate.weight"]
    assert Router(MoEShape(2, 2, 3, 1)).bias.tolist() == [0.0, 0.0, 0.0]


def test_the_router_refuses_a_bad_shape():
    with pytest.raises(ValueError, match="top_k=4; valid"):
        Router(MoEShape(2, 2, 3, 4))


# --- capacity and the load-balancing loss -------------------------------------------------


def test_capacity_rounds_up_factor_times_tokens_times_k_over_experts():
    assert capacity(5, MoEShape(2, 2, experts=2, top_k=1, capacity_factor=1.0)) == 3  # 2.5
    assert capacity(3, MoEShape(2, 2, experts=4, top_k=2, capacity_factor=1.5)) == 3  # 2.25
    assert capacity(8, MoEShape(2, 2, experts=4, top_k=2, capacity_factor=1.0)) == 4  # exact
    assert capacity(6, MoEShape(2, 2, experts=3, top_k=1, capacity_factor=0.5)) == 1  # exact


def test_capacity_keeps_the_first_in_token_order_per_expert():
    """Capacity 1: expert 2 keeps token 0's slot 0 only; expert 0 its first; expert 1 its
    first (token 2, slot 0)."""
    experts = torch.tensor([[2, 0], [2, 2], [1, 0], [1, 2]])
    assert keep_within_capacity(experts, 1, 4).tolist() == [
        [True, True], [False, False], [True, False], [False, False]]
    assert keep_within_capacity(experts, 3, 4).tolist() == [
        [True, True], [True, True], [True, True], [True, False]]
    assert keep_within_capacity(experts, None, 4).dtype == torch.bool


def test_the_load_balancing_loss_on_a_hand_worked_case():
    """E x sum_i f_i P_i: experts (0, 1) and (0, 2) give f = (2, 1, 1)/4; P, the mean of the
    probabilities over the 2 tokens, is (0.6, 0.2, 0.2); loss 3 x (0.3 + 0.05 + 0.05) = 1.2."""
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.7, 0.1, 0.2]], dtype=F64)
    loss = load_balancing_loss(probs, torch.tensor([[0, 1], [0, 2]]), 3)
    assert loss.item() == pytest.approx(1.2, abs=1e-15)
    # the last expert unchosen: f = (2, 2, 0)/4, P = (0.6, 0.2, 0.2): 3 x (0.3 + 0.1) = 1.2
    loss = load_balancing_loss(probs, torch.tensor([[0, 1], [1, 0]]), 3)
    assert loss.item() == pytest.approx(1.2, abs=1e-15)
    # top-1: f = (1, 1, 0)/2 : 3 x (0.3 + 0.1) = 1.2; one expert: f = (0, 0, 1): 3 x 0.2
    assert load_balancing_loss(probs, torch.tensor([[2], [2]]), 3).item() == pytest.approx(0.6)


def test_the_loss_has_a_gradient_through_p_only():
    """d loss / d p[t, e] = E f_e / T: with f = (2, 1, 1)/4, E = 3, T = 2: (3/4, 3/8, 3/8)."""
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.7, 0.1, 0.2]], dtype=F64, requires_grad=True)
    load_balancing_loss(probs, torch.tensor([[0, 1], [0, 2]]), 3).backward()
    assert probs.grad.tolist() == [[0.75, 0.375, 0.375]] * 2


# --- the experts and the one-device layer -------------------------------------------------


def test_swiglu_is_down_of_silu_gate_times_up():
    mlp = SwiGLU(1, 1, F64)
    with torch.no_grad():
        mlp.gate_proj.weight.fill_(2.0)
        mlp.up_proj.weight.fill_(3.0)
        mlp.down_proj.weight.fill_(5.0)
    silu2 = 2 / (1 + math.exp(-2))
    assert mlp(torch.tensor([[1.0]], dtype=F64)).item() == pytest.approx(15 * silu2, rel=1e-15)
    assert all(m.bias is None for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    shapes = {n: tuple(p.shape) for n, p in SwiGLU(2, 3).named_parameters()}
    assert shapes == {"gate_proj.weight": (3, 2), "up_proj.weight": (3, 2),
                      "down_proj.weight": (2, 3)}


def test_make_experts_names_them_by_their_global_number():
    experts = make_experts(MoEShape(2, 3, 8, 2), range(4, 6), F64)
    assert list(experts) == ["4", "5"] and experts["5"].up_proj.weight.dtype == F64


def test_the_layer_sums_the_kept_gated_terms_and_the_shared_expert():
    """Two tokens with the hand router (experts (0, 1) and (1, 0)), capacity 1 per expert:
    token 1 loses both its slots; its output is the shared expert's alone."""
    shape = MoEShape(hidden=2, ffn=2, experts=3, top_k=2, shared=True, capacity_factor=0.5)
    assert capacity(2, shape) == 1
    torch.manual_seed(0)
    moe = MoEFFN(shape, F64)
    router, x = _hand_router()
    moe.router.load_state_dict(router.state_dict())
    out, aux = moe(x)
    routing = moe.last_routing
    assert routing.kept.tolist() == [[True, True], [False, False]]
    with torch.no_grad():
        want0 = (2 / 3 * moe.experts["0"](x[:1]) + 1 / 3 * moe.experts["1"](x[:1])
                 + moe.shared(x[:1]))
        want1 = moe.shared(x[1:])
    assert torch.allclose(out, torch.cat([want0, want1]), atol=1e-15, rtol=0)
    # f = (1, 1, 0)/2 counted before the drop; P = (8/13 + 4/21, 4/13 + 16/21, ...)/2
    want_aux = 3 * (0.5 * (8 / 13 + 4 / 21) / 2 + 0.5 * (4 / 13 + 16 / 21) / 2)
    assert aux.item() == pytest.approx(want_aux, rel=1e-14)
    assert MoEFFN(MoEShape(2, 2, 3, 1)).shared is None


def test_the_layer_without_capacity_keeps_everything_and_keeps_the_input_shape():
    torch.manual_seed(0)
    moe = MoEFFN(MoEShape(hidden=2, ffn=2, experts=3, top_k=1), F64)
    x = torch.randn(2, 3, 2, dtype=F64)
    out, _ = moe(x)
    routing = moe.last_routing
    assert out.shape == (2, 3, 2) and routing.kept.all() and routing.experts.shape == (6, 1)
    tokens = x.reshape(-1, 2)
    with torch.no_grad():
        want = torch.stack([moe.experts[str(int(e))](t) for t, e in
                            zip(tokens, routing.experts[:, 0], strict=True)])
    assert torch.allclose(out.reshape(-1, 2), want, atol=1e-15, rtol=0)  # top-1: gate 1


# --- the split and the permutation --------------------------------------------------------


def test_expert_range_gives_each_rank_its_contiguous_block():
    assert expert_range(8, 4, 2) == range(4, 6)
    assert expert_range(8, 1, 0) == range(0, 8)
    assert expert_range(6, 3, 2) == range(4, 6)
    assert expert_range(3, 3, 1) == range(1, 2)
    with pytest.raises(ValueError, match=r"experts=4 is not divisible by ep=0; valid ep: "
                                         r"\[1, 2, 4\]"):
        expert_range(4, 0, 0)
    with pytest.raises(ValueError, match=r"experts=5 is not divisible by ep=2; valid ep: \[1, 5\]"):
        expert_range(5, 2, 1)


def _routing(experts: list[list[int]], num_experts: int) -> Routing:
    e = torch.tensor(experts)
    return Routing(e, torch.ones(e.shape, dtype=F64), torch.zeros(len(e), num_experts, dtype=F64),
                   torch.ones(e.shape, dtype=torch.bool))


def test_permute_sorts_the_copies_by_expert_stably():
    """Experts (2, 0), (0, 1), (2, 0): flat (2, 0, 0, 1, 2, 0); expert 0 gets flat rows 1, 2,
    5, expert 1 row 3, expert 2 rows 0, 4 (tokens 0, 1, 2, 1, 0, 2); expert 3 none."""
    x = torch.tensor([[1.0], [2.0], [3.0]])
    moved = permute(x, _routing([[2, 0], [0, 1], [2, 0]], 4))
    assert moved.order.tolist() == [1, 2, 5, 3, 0, 4]
    assert moved.tokens[:, 0].tolist() == [1.0, 2.0, 3.0, 2.0, 1.0, 3.0]
    assert moved.counts.tolist() == [3, 1, 2, 0]
    back = unpermute(moved.tokens, moved.order)
    assert back[:, 0].tolist() == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]  # (token, slot) order


def test_undo_index_is_the_inverse_permutation():
    assert undo_index(torch.tensor([2, 0, 1])).tolist() == [1, 2, 0]
    assert undo_index(torch.tensor([3, 0, 1, 2])).tolist() == [1, 2, 3, 0]
    rows = torch.tensor([10, 20, 30])
    assert unpermute(rows, torch.tensor([2, 0, 1])).tolist() == [20, 30, 10]


class _Scale(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.factor * x


@pytest.mark.parametrize("limit, want, kept", [
    (None, [10, 200, 300, 40, 50], [3, 2]),
    (2, [10, 200, 300, 40, 0], [2, 2]),
    (1, [10, 200, 0, 0, 0], [1, 1]),
    (0, [0, 0, 0, 0, 0], [0, 0]),
])
def test_the_local_experts_take_their_rows_in_arrival_order(limit, want, kept):
    """From rank 0: 1 row for local expert 0, 2 for expert 1; from rank 1: 2 for expert 0:
    arrived rows 0 | 1, 2 | 3, 4; expert 0 (x10) takes rows 0, 3, 4; expert 1 (x100) 1, 2."""
    arrived = torch.tensor([[1.0], [2.0], [3.0], [4.0], [5.0]])
    received = torch.tensor([[1, 2], [2, 0]])
    experts = nn.ModuleDict({"2": _Scale(10.0), "3": _Scale(100.0)})
    results, got = run_local_experts(arrived, received, experts, limit)
    assert results[:, 0].tolist() == want and got.tolist() == kept


def test_aux_share_on_a_hand_worked_case():
    """Global counts (3, 1) of 4 tokens: f = (3/4, 1/4); this rank's probabilities summed,
    over 4: (0.75/4, 1.25/4); share 2 x (3/4 x 0.1875 + 1/4 x 0.3125) = 0.4375."""
    probs = torch.tensor([[0.5, 0.5], [0.25, 0.75]], dtype=F64)
    assert aux_share(probs, torch.tensor([3, 1]), 4).item() == pytest.approx(0.4375, abs=1e-16)


# --- the all-to-alls on 2 thread ranks ----------------------------------------------------


COUNTS = [torch.tensor([1, 2, 0, 3]), torch.tensor([2, 0, 1, 1])]  # rows per expert, 2 ranks


def test_the_counts_exchange_and_the_global_totals():
    """Rank 0 hears (1, 2) from itself and (2, 0) from rank 1, for its experts 0 and 1;
    rank 1 hears (0, 3) and (1, 1); both sum to (3, 2, 1, 4), their own counts unchanged."""
    def work(rank, group):
        mine = COUNTS[rank].clone()
        return exchange_counts(mine, group), global_counts(mine, group), mine

    (r0, t0, m0), (r1, t1, m1) = _ranks(2, work)
    assert r0.tolist() == [[1, 2], [2, 0]] and r1.tolist() == [[0, 3], [1, 1]]
    assert t0.tolist() == t1.tolist() == [3, 2, 1, 4]
    assert m0.tolist() == [1, 2, 0, 3] and m1.tolist() == [2, 0, 1, 1]


def test_dispatch_and_combine_move_rows_and_their_gradients():
    """Rank 0 sends rows 0-2 home and 3-5 to rank 1; rank 1 rows 10, 11 to rank 0 and keeps
    12, 13. The gradient of each arrived row (its weight) goes back to where it came from;
    combine is the way back."""
    send = [[3, 3], [2, 2]]
    recv = [[3, 2], [3, 2]]

    def work(rank, group):
        x = (10.0 * rank + torch.arange(6 - 2 * rank, dtype=F64))[:, None].requires_grad_()
        arrived = dispatch(x, send[rank], recv[rank], group)
        weight = (100 * rank + 1 + torch.arange(5, dtype=F64))[:, None]
        (arrived * weight).sum().backward()
        y = arrived.detach().clone().requires_grad_()
        home = combine(2 * y, send[rank], recv[rank], group)
        (home * torch.arange(1, len(home) + 1, dtype=F64)[:, None]).sum().backward()
        return arrived[:, 0].tolist(), x.grad[:, 0].tolist(), home[:, 0].tolist(), y.grad[:, 0]

    (a0, g0, h0, y0), (a1, g1, h1, y1) = _ranks(2, work)
    assert a0 == [0, 1, 2, 10, 11] and a1 == [3, 4, 5, 12, 13]
    assert g0 == [1, 2, 3, 101, 102, 103] and g1 == [4, 5, 104, 105]
    assert h0 == [0, 2, 4, 6, 8, 10] and h1 == [20, 22, 24, 26]
    # y's rows went home to positions: rank 0's (0, 1, 2 | 1, 2 of rank 1), x 2
    assert y0.tolist() == [2, 4, 6, 2, 4] and y1.tolist() == [8, 10, 12, 6, 8]


# --- the layer on 2 ranks against one device ---------------------------------------------


def _grads(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("shared, capacity_factor, top_k", [(True, 1.0, 2), (False, None, 1)])
def test_the_layer_on_two_ranks_equals_one_device(shared, capacity_factor, top_k):
    """Output, each rank's share of the aux loss (summed), the input's gradient, the
    router's and shared expert's (summed over ranks) and each expert's, to 1e-12; and the
    rows each rank sent and received, counted from one device's routing."""
    torch.manual_seed(0)
    shape = MoEShape(hidden=4, ffn=6, experts=4, top_k=top_k, shared=shared,
                     capacity_factor=capacity_factor)
    moe = MoEFFN(shape, F64)
    x = torch.randn(2, 6, 4, dtype=F64)
    dout = torch.randn(2, 6, 4, dtype=F64)
    xx = x.clone().requires_grad_()
    out, aux = moe(xx)
    ((out * dout).sum() + aux).backward()
    want = _grads(moe)
    routing = moe.last_routing
    if capacity_factor is not None:
        assert not routing.kept.all()
    counts = [torch.bincount(routing.experts[6 * r:6 * r + 6].reshape(-1), minlength=4)
              for r in range(2)]
    kept = torch.bincount(routing.experts[routing.kept], minlength=4)

    def work(rank, group):
        layer = ExpertParallelMoE(moe, group)
        mine = x[rank].clone().requires_grad_()
        o, a = layer(mine)
        ((o * dout[rank]).sum() + a).backward()
        sum_replicated_grads(layer)
        return o.detach(), a.detach(), mine.grad, _grads(layer), layer.last_splits, \
            layer.last_routing

    results = _ranks(2, work)
    assert torch.allclose(torch.stack([r[0] for r in results]), out.detach(), atol=1e-12, rtol=0)
    assert (results[0][1] + results[1][1]).item() == pytest.approx(aux.item(), abs=1e-13)
    assert torch.allclose(torch.stack([r[2] for r in results]), xx.grad, atol=1e-12, rtol=0)
    for rank, (*_, grads, splits, rank_routing) in enumerate(results):
        mine = [f"experts.{e}." for e in expert_range(4, 2, rank)]
        names = {n for n in want if not n.startswith("experts.") or n.startswith(tuple(mine))}
        assert set(grads) == names
        for name in names:
            assert torch.allclose(grads[name], want[name], atol=1e-12, rtol=0), name
        assert torch.equal(rank_routing.experts, routing.experts[6 * rank:6 * rank + 6])
        assert rank_routing.kept.all()
        assert torch.equal(splits.counts, counts[rank])
        assert splits.sent == [int(counts[rank][:2].sum()), int(counts[rank][2:].sum())]
        assert splits.received == [int(c[2 * rank:2 * rank + 2].sum()) for c in counts]
        assert splits.arrived.tolist() == [c[2 * rank:2 * rank + 2].tolist() for c in counts]
        assert splits.kept.tolist() == kept[2 * rank:2 * rank + 2].tolist()
        load = layer_load_of(splits, top_k)
        assert load == LayerLoad(6, tuple(sum(c[2 * rank + i] for c in counts).item()
                                          for i in range(2)), tuple(splits.kept.tolist()))


def layer_load_of(splits, top_k: int) -> LayerLoad:
    """``layer_load`` of a stand-in layer holding ``splits``."""
    class Stub:
        shape = MoEShape(4, 6, 4, top_k)
        last_splits = splits
    return layer_load(Stub())  # type: ignore[arg-type]


def test_the_rank_layer_keeps_its_experts_under_their_names_and_copies_the_rest():
    class Group:  # what the constructor asks of a process group
        def __init__(self, rank: int, size: int) -> None:
            self.r, self.s = rank, size

        def rank(self) -> int:
            return self.r

        def size(self) -> int:
            return self.s

    moe = MoEFFN(MoEShape(2, 3, 6, 2, shared=True), F64)
    layer = ExpertParallelMoE(moe, Group(2, 3))  # type: ignore[arg-type]
    assert list(layer.experts) == ["4", "5"] and layer.last_splits is None
    assert torch.equal(layer.experts["5"].up_proj.weight, moe.experts["5"].up_proj.weight)
    assert layer.router.gate.weight is not moe.router.gate.weight
    assert torch.equal(layer.shared.down_proj.weight, moe.shared.down_proj.weight)
    with pytest.raises(ValueError, match="the layer has not run"):
        layer_load(layer)


# --- traffic ------------------------------------------------------------------------------


def test_the_routing_matrix_sums_each_ranks_rows_per_destination():
    """ep 2, 4 experts: rank 0 (1, 2 | 0, 3), rank 1 (2, 0 | 1, 1) -> ((3, 3), (2, 2))."""
    assert routing_matrix(torch.stack(COUNTS)).tolist() == [[3, 3], [2, 2]]
    counts = torch.tensor([[1, 0, 2, 0, 0, 3], [4, 0, 1, 4, 6, 0], [3, 4, 8, 0, 9, 0]])
    assert routing_matrix(counts).tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


@pytest.mark.parametrize("rank, out, back", [(0, 5, 11), (1, 10, 10), (2, 15, 9)])
def test_each_rank_sends_its_rows_away_and_the_others_rows_back(rank, out, back):
    """M = ((1, 2, 3), (4, 5, 6), (7, 8, 9)), rows of 5 x 4 bytes, 6 experts on 3 ranks:
    rank 2 sends 7 + 8 rows and returns 3 + 6; counts 2 ranks x 2 experts x 8 bytes; the
    all-reduce of 6 int64 counts by the ring, 2 x 2/3 x 48 = 64 bytes."""
    matrix = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    t = ep_traffic(matrix, rank, hidden=5, element_bytes=4, experts=6)
    assert (t.dispatch, t.combine) == (20 * out, 20 * back)
    assert (t.dispatch_back, t.combine_back) == (20 * out, 20 * back)
    assert t.counts == 32 and isinstance(t.counts, int) and t.totals == pytest.approx(64.0)
    assert t.all_to_all_forward == 32 + 20 * (out + back)
    assert t.all_to_all_backward == 20 * (out + back)
    assert t.all_to_all == 32 + 40 * (out + back)


def test_two_ranks_traffic_by_hand():
    """M = ((3, 3), (2, 2)), rows of 5 float32: rank 1 sends 2 rows, returns 3; counts 1 x 2
    x 8 bytes; the all-reduce of 4 counts: 2 x 1/2 x 32 = 32 bytes."""
    t = ep_traffic(torch.tensor([[3, 3], [2, 2]]), 1, hidden=5, element_bytes=4, experts=4)
    assert (t.counts, t.dispatch, t.combine, t.totals) == (16, 40, 60, 32.0)
    assert COUNT_BYTES == 8
    with pytest.raises(ValueError, match="rank=-1; valid: 0 to 1"):
        ep_traffic(torch.ones(2, 2, dtype=torch.long), -1, 8, 8, 4)


# --- balance ------------------------------------------------------------------------------


def test_imbalance_by_hand():
    counts = torch.tensor([1, 3, 0, 4])  # mean 2
    assert imbalance(counts) == 2.0 and imbalance(counts, ep=4) == 2.0
    assert imbalance(counts, ep=2) == 1.0  # ranks 4 and 4
    assert imbalance(counts, ep=1) == 1.0
    assert imbalance(torch.tensor([1, 2])) == 4 / 3  # in float64
    assert imbalance(torch.tensor([0, 0, 1, 5]), ep=2) == 2.0  # ranks 0 and 6
    with pytest.raises(ValueError, match="ep=0 does not divide experts=4"):
        imbalance(counts, ep=0)
    with pytest.raises(ValueError, match="ep=-2 does not divide experts=4"):
        imbalance(counts, ep=-2)


def test_update_bias_adds_rate_times_the_sign_towards_the_mean():
    """Counts (5, 1, 3, 3), mean 3: expert 0 down, 1 up, 2 and 3 stay; twice: twice that."""
    router = Router(MoEShape(2, 2, 4, 1))
    router.bias.copy_(torch.tensor([1.0, 0.0, -1.0, 0.5]))
    update_bias(router, torch.tensor([5, 1, 3, 3]), rate=0.25)
    assert router.bias.tolist() == [0.75, 0.25, -1.0, 0.5]
    update_bias(router, torch.tensor([5, 1, 3, 3]), rate=0.25)
    assert router.bias.tolist() == [0.5, 0.5, -1.0, 0.5]
    assert router.bias.dtype == torch.float32


# --- memory -------------------------------------------------------------------------------


LM = LMConfig(vocab=10, hidden=4, blocks=2, ffn=8, heads=2, kv_heads=1, rope=True)


def test_moe_saved_bytes_by_hand():
    """3 tokens, top-2, 4 experts, H 2, F 3, 4-byte elements, shared; local experts met 4
    rows (kept 3) and 0: router 3x4x4 + 9x4 + 6x8 = 132; moved 2x6x8 + 6x2x4 + 6x4 + 4x4
    = 184; the busy expert 3 x 14 x 4 + 4 x 8 = 200, the idle one nothing; placed 3 x (8 +
    8) = 48; shared 4 x 3 x 3 x 4 = 144."""
    shape = MoEShape(hidden=2, ffn=3, experts=4, top_k=2, shared=True)
    load = LayerLoad(3, (4, 0), (3, 0))
    assert moe_saved_bytes(shape, load, 4) == 132 + 184 + 200 + 48 + 144
    plain = MoEShape(hidden=2, ffn=3, experts=4, top_k=2)
    assert moe_saved_bytes(plain, load, 4) == 132 + 184 + 200 + 48


def test_balanced_load_by_hand():
    """2 ranks x 6 tokens x 2 slots over 4 experts: 6 rows each; capacity ceil(0.5 x 12 x 2
    / 4) = 3."""
    shape = MoEShape(4, 6, 4, 2, capacity_factor=0.5)
    assert balanced_load(6, shape, 2) == LayerLoad(6, (6, 6), (3, 3))
    assert balanced_load(6, MoEShape(4, 6, 4, 2), 4) == LayerLoad(6, (12,), (12,))  # 48 / 4
    with pytest.raises(ValueError, match="10 rows do not split evenly over 4 experts"):
        balanced_load(5, MoEShape(4, 6, 4, 2), 1)


def _rank_model(shape: MoEShape, rank: int, ep: int) -> nn.Module:
    class Group:
        def rank(self) -> int:
            return rank

        def size(self) -> int:
            return ep

    return expert_parallel(moe_llama(LM, shape, seed=0), Group())  # type: ignore[arg-type]


@pytest.mark.parametrize("shared", [False, True])
def test_parameter_counts_match_a_rank_of_a_real_model(shared):
    """The numbers and tensors of rank 1 of 2's parameters, and its routers' biases; with
    one block's experts idle, the trained ones lose 3 tensors and 3 H F each."""
    shape = MoEShape(hidden=4, ffn=6, experts=4, top_k=2, shared=shared)
    model = _rank_model(shape, 1, 2)
    params = list(model.parameters())
    counts = parameter_counts(LM, shape, 2)
    assert counts["numel"] == counts["trained"] == sum(p.numel() for p in params)
    assert counts["tensors"] == counts["trained_tensors"] == len(params)
    biases = [b for n, b in model.named_buffers() if n.endswith("router.bias")]
    assert counts["buffers"] == sum(b.numel() for b in biases) == 8
    loads = [LayerLoad(4, (3, 0), (3, 0)), LayerLoad(4, (0, 0), (0, 0))]
    idle = parameter_counts(LM, shape, 2, loads)
    assert idle["numel"] == counts["numel"] and idle["tensors"] == counts["tensors"]
    assert counts["trained"] - idle["trained"] == 3 * 3 * 4 * 6
    assert counts["trained_tensors"] - idle["trained_tensors"] == 3 * 3
    with pytest.raises(ValueError, match="1 loads for 2 blocks; valid: one per block"):
        parameter_counts(LM, shape, 2, loads[:1])


def test_held_counts_parameters_buffers_grads_and_optimizer_state():
    """Linear(3, 2) in float64 (8 elements, 64 bytes), an unused 5-element parameter (40
    bytes) and a float32 buffer of 5 (20 bytes): after a backward the used tensors have a
    gradient (64 bytes); Adam's state of each, exp_avg, exp_avg_sq and a float32 step (2 x 64
    + 2 x 4 bytes), counts, a number in it does not, the unused one has none."""
    model = nn.Linear(3, 2, dtype=F64)
    model.idle = nn.Parameter(torch.zeros(5, dtype=F64))
    model.register_buffer("stat", torch.zeros(5))
    assert held(model) == DeviceMemory(weights=124, grads=0, optimizer_state=0, activations=0)
    model(torch.ones(1, 3, dtype=F64)).sum().backward()
    state = {p: {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p),
                 "exp_avg_sq": torch.zeros_like(p), "lr": 0.5}
             for p in (model.weight, model.bias)}
    optimizer = SimpleNamespace(state=state)  # what held reads of an optimizer
    assert held(model, optimizer, activations=7) == DeviceMemory(  # type: ignore[arg-type]
        weights=124, grads=64, optimizer_state=136, activations=7)
    assert held(model) == DeviceMemory(weights=124, grads=64, optimizer_state=0)


def test_the_rank_ledger_defaults_to_a_balanced_router_adam_and_fp32():
    shape = MoEShape(hidden=4, ffn=6, experts=4, top_k=2)
    plain = ep_rank_memory(LM, shape, ep=2, batch=1, seq=4)
    assert plain == ep_rank_memory(LM, shape, ep=2, batch=1, seq=4,
                                   loads=[balanced_load(4, shape, 2)] * 2,
                                   optimizer="adam", precision="fp32")
    model = _rank_model(shape, 0, 2)
    biases = sum(b.numel() for n, b in model.named_buffers() if n.endswith("router.bias"))
    assert plain.weights == 4 * (sum(p.numel() for p in model.parameters()) + biases)
    assert plain.grads == sum(p.numel() * 4 for p in model.parameters())
    assert plain.optimizer_state == 2 * plain.grads + 4 * len(list(model.parameters()))


# --- the rounding bound on hand-worked cases ----------------------------------------------


def _zero_input_case(shared: bool):
    """2 experts, both chosen (k = E: no choice to flip), router weights all 1, 2 tokens of
    zeros: every logit is 0, p = (1/2, 1/2), every expert's input and output are 0."""
    torch.manual_seed(0)
    moe = MoEFFN(MoEShape(hidden=3, ffn=2, experts=2, top_k=2, shared=shared), F64)
    with torch.no_grad():
        moe.router.gate.weight.fill_(1.0)
    x = torch.zeros(2, 3, dtype=F64)
    dout = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.25, -1.0]], dtype=F64)
    return moe, x, dout


@pytest.mark.parametrize("shared", [False, True])
def test_the_bound_of_zero_tokens_by_hand(shared):
    """Zero tokens: exact zeros out, and in every weight's gradient, so their bounds are 0.
    The auxiliary loss is 1 (f = p = 1/2); its bound, twice ``kappa + gamma(T + E + ranks)
    + 3u`` with ``kappa = gamma(E) + 6u``. The input's gradient comes from the router alone:
    d aux / d p = E f / T = 1/2 on each p (error 4u + u), p . dp = 1/2 (error kappa/2 + 5u/2
    + gamma(2)/2), dz = p (dp - p.dp) = 0, its error p (edp + edot) = 4u + gamma(2)/2 per
    logit; times |W_r| = 1 summed over the 2 experts, twice: 16u + 2 gamma(2)."""
    moe, x, dout = _zero_input_case(shared)
    for ranks in (1, 3):
        bounds = moe_bounds(moe, x, dout, ranks=ranks)
        assert set(bounds) == {"out", "aux", "input", *dict(moe.named_parameters())}
        kappa = gamma(2) + 6 * U
        assert bounds["aux"].item() == pytest.approx(
            2 * (kappa + gamma(4 + ranks) + 3 * U), rel=1e-12)
        want = (16 * U + 2 * gamma(2)) * torch.ones(2, 3, dtype=F64)
        assert torch.allclose(bounds["input"], want, rtol=1e-12, atol=0)
        for name, value in bounds.items():
            if name not in ("aux", "input"):
                assert torch.count_nonzero(value) == 0, name
    half = moe_bounds(moe, x, dout, aux_weight=0.0)  # no auxiliary gradient: nothing at all
    assert torch.count_nonzero(half["input"]) == 0


def test_gamma_by_hand():
    assert gamma(0) == 0.0 and U == 2.0**-53
    assert gamma(2) == 2 * 2.0**-53 / (1 - 2 * 2.0**-53)
    both = gamma(torch.tensor([1.0, 3.0], dtype=F64)).tolist()
    assert both == pytest.approx([U / (1 - U), 3 * U / (1 - 3 * U)], rel=1e-15)


def test_only_the_token_whose_choice_could_flip_is_refused():
    """Token 0 scores (8, 4, 1)/13: clear; token 1 is zeros, three equal scores: refused by
    number, for k = 1 and k = 2; with k = E there is nothing to choose, nothing refused."""
    router, x = _hand_router()
    x = torch.cat([x[:1], torch.zeros(1, 2, dtype=F64)])
    for k in (1, 2, 3):
        moe = MoEFFN(MoEShape(hidden=2, ffn=2, experts=3, top_k=k), F64)
        moe.router.load_state_dict(router.state_dict())
        if k == 3:
            assert moe_bounds(moe, x, torch.ones_like(x))["out"].shape == (2, 2)
            continue
        with pytest.raises(ValueError, match=f"^token 1: its scores {k} and {k + 1} differ by "
                                             r"0\.00e\+00, within their rounding"):
            moe_bounds(moe, x, torch.ones_like(x))
    moe = MoEFFN(MoEShape(hidden=2, ffn=2, experts=3, top_k=1), F64)
    moe.router.load_state_dict(router.state_dict())
    assert moe_bounds(moe, x[:1], torch.ones_like(x[:1]))["aux"] > 0  # token 0 alone: clear


def test_bound_ratios_divide_and_flag_a_difference_where_the_bound_is_zero():
    got = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([1.0, 5.0]), "c": torch.zeros(1)}
    want = {"a": torch.tensor([1.5, 2.0]), "b": torch.tensor([1.0, 4.0]), "c": torch.zeros(1)}
    bounds = {"a": torch.tensor([1.0, 0.0]), "b": torch.tensor([0.0, 0.5]), "c": torch.zeros(1)}
    assert bound_ratios(got, want, bounds) == {"a": 0.5, "b": 2.0, "c": 0.0}
    bounds["b"] = torch.tensor([0.0, 0.0])
    assert bound_ratios(got, want, bounds)["b"] == math.inf


def test_the_output_bound_of_one_scalar_token_by_hand():
    """H = F = E = k = 1, every weight 1 but the router's (0), x = 1: p = 1 (relative error
    kappa = gamma(1) + 6u), the gate 1 (2 kappa + gamma(1) + u); the expert: a = b = 1
    (gamma(1) each), s = silu(1) = sigma(1) (4u s + silu'(1) gamma(1)), h = s b (b's error
    times s, s's error, u h), y = h (plus gamma(1) h); the output g y: y's error, the gate's
    times y, u y, and gamma(1) y for the one-term sum; twice all that."""
    moe = MoEFFN(MoEShape(hidden=1, ffn=1, experts=1, top_k=1), F64)
    with torch.no_grad():
        for p in moe.parameters():
            p.fill_(1.0)
        moe.router.gate.weight.zero_()
    one = torch.ones(1, 1, dtype=F64)
    g1, sig = gamma(1), 1 / (1 + math.exp(-1))
    s, silu1 = sig, sig * (1 + (1 - sig))
    kappa = g1 + 6 * U
    e_gate = 2 * kappa + g1 + U
    e_s = 4 * U * s + silu1 * g1
    e_y = (e_s + s * g1 + U * s) + g1 * s
    want = 2 * (e_y + e_gate * s + U * s + g1 * s)
    bounds = moe_bounds(moe, one, one)
    assert bounds["out"].item() == pytest.approx(want, rel=1e-12)
    # backward: dy = g dout = 1 (the gate's error, and u); dh = dy W_d = 1 (plus gamma(1));
    # W_d's gradient dy h: dy's error times h, h's error, gamma(1) h for its one row;
    # W_u's gradient dh s x: dh's error times s, s's error, u s, gamma(1) s
    e_dy = e_gate + U
    e_h = e_s + s * g1 + U * s
    down = bounds["experts.0.down_proj.weight"].item()
    assert down == pytest.approx(2 * (e_dy * s + e_h + g1 * s), rel=1e-12)
    up = bounds["experts.0.up_proj.weight"].item()
    assert up == pytest.approx(2 * (e_s + s * (e_dy + g1) + U * s + g1 * s), rel=1e-12)


# --- refusals in full, and what starts empty ----------------------------------------------


def test_refusal_messages_in_full():
    with pytest.raises(ValueError, match=r"^capacity_factor=0\.0; valid: a number > 0, or None "
                                         r"for no limit$"):
        MoEShape(2, 2, 2, 1, capacity_factor=0.0).validate()
    with pytest.raises(ValueError, match="^no tokens counted: imbalance is undefined$"):
        imbalance(torch.zeros(4))
    assert imbalance(torch.tensor([0, 2])) == 2.0  # a mean of 1 is fine
    with pytest.raises(ValueError, match="^experts=6 is not divisible by ep=4$"):
        routing_matrix(torch.ones(4, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="^rank=3; valid: 0 to 2$"):
        ep_traffic(torch.ones(3, 3, dtype=torch.long), 3, 8, 8, 6)
    with pytest.raises(ValueError, match=r"^precision='mixed'; valid: 'fp32', 'fp64' \(the MoE "
                                         r"layer's activations are not modelled in mixed "
                                         r"precision\)$"):
        ep_rank_memory(LM, MoEShape(4, 6, 4, 2), ep=1, batch=1, seq=4, precision="mixed")
    with pytest.raises(ValueError, match=r"^loads of \[3, 3\] tokens; valid: 4 each$"):
        ep_rank_memory(LM, MoEShape(4, 6, 4, 2), ep=1, batch=1, seq=4,
                       loads=[LayerLoad(3, (6,) * 4, (6,) * 4)] * 2)
    with pytest.raises(ValueError, match="^the layer has not run; valid: read its load after "
                                         "a forward$"):
        layer_load(SimpleNamespace(last_splits=None))  # type: ignore[arg-type]


def test_nothing_is_routed_before_a_forward_and_the_bias_takes_the_dtype():
    moe = MoEFFN(MoEShape(2, 2, 4, 1), F64)
    assert moe.last_routing is None and moe.router.bias.dtype == F64
    assert ExpertParallelMoE(moe, SimpleNamespace(rank=lambda: 0, size=lambda: 2)).last_routing \
        is None  # type: ignore[arg-type]


@pytest.mark.parametrize("precision, e", [("fp32", 4), ("fp64", 8)])
def test_the_ledger_swaps_the_dense_mlps_for_the_moe_layers(precision, e):
    """1 rank of 4 tokens: the dense estimate less 2 blocks x 4 tokens x 4 ffn-wide tensors of
    8, plus each block's MoE layer; an expert that met no rows has no gradient and no Adam
    state (3 x 4 x 6 weights, 3 tensors); a row dropped keeps nothing."""
    shape = MoEShape(hidden=4, ffn=6, experts=4, top_k=2)
    plain = ep_rank_memory(LM, shape, ep=1, batch=1, seq=4, precision=precision)
    dense = estimate_transformer(TransformerShape.of(LM), batch=1, seq=4, optimizer="adam",
                                 precision=precision).sum()
    even = LayerLoad(4, (2, 2, 2, 2), (2, 2, 2, 2))
    assert plain.activations == dense.activations - 2 * 4 * 4 * 8 * e \
        + 2 * moe_saved_bytes(shape, even, e)
    numel = parameter_counts(LM, shape, 1)["numel"]
    assert plain.grads == numel * e and plain.optimizer_state == 2 * numel * e + 4 * (
        parameter_counts(LM, shape, 1)["tensors"])
    skewed = LayerLoad(4, (4, 2, 2, 0), (3, 2, 2, 0))  # capacity dropped one row
    idle = ep_rank_memory(LM, shape, ep=1, batch=1, seq=4, loads=[skewed, even],
                          precision=precision)
    assert plain.grads - idle.grads == 3 * 4 * 6 * e
    assert plain.optimizer_state - idle.optimizer_state == 2 * 3 * 4 * 6 * e + 3 * 4
    # the same 8 rows arrived, 7 kept: one row's (4 + 4 x 6) e fewer, and (4 e + 8) placed
    assert plain.activations - idle.activations == (4 + 24) * e + (4 * e + 8)
    assert idle.weights == plain.weights
