"""Lesson 13's MoE layout without a launch: the gradient rule on thread ranks against one
process, with a planted bug that fails it; the flags that keep an unreached expert
without a gradient; what the ledger holds for a rank; the timed meter's all-to-all.

Tolerance (chosen): 1e-12 absolute on gradients of order 0.1 to 1 in float64, some
thousands of epsilons: the ranks add the same products in other orders (each tensor-
parallel rank its slice of the tokens, then the sum over tp). A missing sum over tp
leaves out half of every expert's gradient, orders of magnitude beyond it."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from helpers.composed.experts import (
    ComposedMoE,
    RankRouting,
    layout_name,
    moe_block_plan,
    reduce_moe_gradients,
)
from helpers.composed.layout import Layout
from helpers.composed.ledger import _pieces, moe_kind, predicted_memory, predicted_sent
from helpers.expert_parallel.memory import LayerLoad
from helpers.expert_parallel.moe import MoEFFN, MoEShape
from helpers.runs.llama_3d.config import TrainerConfig
from helpers.torchrun.in_notebook import run_mesh, run_ranks

SHAPE = MoEShape(hidden=8, ffn=12, experts=4, top_k=2)
DP, TP, ROWS, SEQ = 2, 2, 4, 6
TOLERANCE = 1e-12
ALL_TO_ALL_SINGLE = dist.all_to_all_single  # the function itself, before any meter patches it


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    moe = MoEFFN(SHAPE).double()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(ROWS, SEQ, SHAPE.hidden, generator=g, dtype=torch.float64)
    target = torch.randn(SHAPE.hidden, generator=g, dtype=torch.float64)
    return moe, x, target


def _one_process(moe: MoEFFN, x: torch.Tensor, target: torch.Tensor) -> dict:
    """The whole batch's mean per-token loss ``(out . target)^2``, and every gradient."""
    moe = copy.deepcopy(moe)
    out, _ = moe(x)
    ((out @ target) ** 2).mean().backward()
    return {n: None if p.grad is None else p.grad.clone() for n, p in moe.named_parameters()}


def _ranks(moe, x, target, sum_over_tp: bool = True) -> list:
    """dp x tp thread ranks: dp rank d takes its rows, tp rank t its slice of the sequence
    (as sequence parallelism hands the MoE layer its tokens); each back-propagates its dp
    rank's mean loss into its tokens; the router's gradient averaged over dp (what
    fully_shard does), then the rule."""
    def work(rank, groups):
        d, t = groups["dp"].rank(), groups["tp"].rank()
        layer = ComposedMoE(copy.deepcopy(moe), groups["dp"])
        rows = x[d * ROWS // DP:(d + 1) * ROWS // DP]
        mine = rows[:, t * SEQ // TP:(t + 1) * SEQ // TP].clone()
        (((layer(mine) @ target) ** 2).sum() / rows[..., 0].numel()).backward()
        for p in layer.router.parameters():  # fully_shard's part: the mean over dp
            dist.all_reduce(p.grad, group=groups["dp"])
            p.grad /= DP
        reduce_moe_gradients(layer, groups["tp"] if sum_over_tp else None, DP)
        return {n: None if p.grad is None else p.grad.clone()
                for n, p in layer.named_parameters()}

    results = run_mesh({"dp": DP, "tp": TP}, work, timeout=60)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def _worst(ranks: list, reference: dict) -> float:
    """The largest |difference| of any rank's gradient from one process's (inf where one
    has a gradient and the other none)."""
    worst = 0.0
    for grads in ranks:
        for name, grad in grads.items():
            want = reference[name]
            if (grad is None) != (want is None):
                return float("inf")
            if grad is not None:
                worst = max(worst, (grad - want).abs().max().item())
    return worst


def test_the_rule_gives_every_rank_the_one_process_gradients_and_a_missing_tp_sum_fails():
    moe, x, target = _setup()
    reference = _one_process(moe, x, target)
    right = _ranks(moe, x, target)
    assert _worst(right, reference) <= TOLERANCE
    assert {n.split(".")[1] for grads in right for n in grads if n.startswith("experts")} \
        == {"0", "1", "2", "3"}  # every expert on some rank
    wrong = _ranks(moe, x, target, sum_over_tp=False)
    assert _worst(wrong, reference) > 1e6 * TOLERANCE


def test_an_expert_no_token_reaches_keeps_no_gradient_as_in_one_process():
    moe, x, target = _setup(1)
    moe.router.bias[3] = -10.0  # never chosen
    reference = _one_process(moe, x, target)
    assert reference["experts.3.gate_proj.weight"] is None
    assert _worst(_ranks(moe, x, target), reference) <= TOLERANCE


def test_a_gradient_on_one_tp_rank_only_is_summed_and_kept_on_both():
    """The flags: an expert reached by one tensor-parallel rank's tokens only has a
    gradient there; after the rule both ranks hold the sum (over dp = 1: unchanged)."""
    moe = MoEFFN(SHAPE).double()

    def work(rank, groups):
        layer = ComposedMoE(copy.deepcopy(moe), groups["dp"])
        for p in layer.parameters():
            p.grad = torch.full_like(p, 1.0)
        expert = next(iter(layer.experts.values())).gate_proj.weight
        expert.grad = torch.full_like(expert, 3.0) if rank == 0 else None
        elements = reduce_moe_gradients(layer, groups["tp"], 1)
        return expert.grad, layer.router.gate.weight.grad, elements

    results = run_mesh({"dp": 1, "tp": 2}, work, timeout=30)
    for expert, router, elements in results:
        assert torch.equal(expert, torch.full_like(expert, 3.0))
        assert torch.equal(router, torch.full_like(router, 2.0))  # summed over tp
        experts = sum(p.numel() for p in moe.experts.parameters())
        assert elements == experts + SHAPE.experts * SHAPE.hidden + 3 * SHAPE.experts


def test_the_moe_block_plan_keeps_the_norms_and_hands_the_layer_its_own_tokens():
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput

    from helpers.tensor_parallel.plans import llama_plans

    _, block = llama_plans(sequence_parallel=True)
    plan = moe_block_plan(block)
    assert not any(k.startswith("mlp.") for k in plan)
    assert {"mlp_norm", "attn_norm", "attn", "attn.q_proj"} <= set(plan)  # a lost norm: caught
    style = plan["mlp"]
    assert isinstance(style, PrepareModuleInput) and style.use_local_output
    assert style.input_layouts == style.desired_input_layouts == (Shard(1),)


def _config(**change) -> TrainerConfig:
    return TrainerConfig(dp=2, tp=2, pp=2, experts=4, top_k=2, dtype="float64", **change)


def test_a_rank_holds_its_experts_whole_and_the_router_sharded():
    config = _config()
    pieces = {name: (held, piece) for name, held, piece in _pieces(config, 0)}
    experts = [n for n in pieces if moe_kind(n) == "expert"]
    h, f = config.model.hidden, config.moe.ffn  # each expert ffn / top_k wide
    assert {n.split(".")[4] for n in experts} == {"0", "1"}  # E / ep = 2 of each block
    assert len(experts) == 2 * 2 * 3  # 2 blocks on the stage, 3 matrices each
    assert all(pieces[n] == (h * f, h * f) for n in experts)  # neither tp nor fully_shard
    router = pieces["blocks.0.mlp.router.gate.weight"]
    assert router == (4 * h // 2, 4 * h)  # whole over tp, sharded over dp
    assert layout_name(config.layout, config.experts) == "ep=2 x tp=2 x pp=2" == config.name
    assert layout_name(Layout(dp=2), 0) == "dp=2"


def test_the_moe_predictions_follow_the_routing_and_need_it():
    """An expert no token reached holds no gradient; the all-to-all's bytes are the rows
    routed to the other rank's experts, and nothing when every row stays home."""
    config = _config()
    even = LayerLoad(tokens=16, arrived=(16, 16), kept=(16, 16))

    def routing(counts: torch.Tensor, trained: int = 4) -> RankRouting:
        return RankRouting(0, [[counts] * 4], [[even, even], [even, even]], trained, 4)

    spread = torch.full((2, 4), 8)  # each rank: 8 rows to each expert, half of them away
    home = torch.tensor([[16, 16, 0, 0], [0, 0, 16, 16]])  # every row to its own experts
    full, idle = predicted_memory(config, 0, routing(spread)), predicted_memory(
        config, 0, routing(spread, trained=3))
    assert full.grads - idle.grads == 3 * config.model.hidden * config.moe.ffn * 8
    assert full.optimizer_state == idle.optimizer_state  # AdamW keeps the idle one's state
    away = (predicted_sent(config, 0, "ring", routing(spread))["dp"]
            - predicted_sent(config, 0, "ring", routing(home))["dp"])
    # 2 blocks x 2 micro-batches; dispatch, combine and their backward; 16 rows of 64 x 8 B
    assert away == 4 * 4 * 16 * config.model.hidden * 8
    with pytest.raises(ValueError, match="without its routing"):
        predicted_memory(config, 0)


def test_the_timed_meter_counts_an_uneven_all_to_all():
    from helpers.comm.meter import ALL_TO_ALL, CommMeter

    def work(rank, group):
        send, recv = [[1, 3], [2, 2]][rank], [[1, 2], [3, 2]][rank]
        x, out = torch.ones(4, 2), torch.empty(sum(recv), 2)
        if rank == 1:  # unmetered: the patch is process-wide
            ALL_TO_ALL_SINGLE(out, x, recv, send, group=group)
            return None
        with CommMeter(timed=True) as meter:
            dist.all_to_all_single(out, x, recv, send, group=group)
        return meter.per_collective.calls[ALL_TO_ALL], meter.per_collective.ring[ALL_TO_ALL]

    assert run_ranks(2, work, timeout=30)[0] == (1, 24.0)  # 3 rows of 8 B to rank 1
    assert dist.all_to_all_single is ALL_TO_ALL_SINGLE


def test_the_fingerprint_knows_the_moe_models_parameter_names():
    from helpers.composed.experts import build_model
    from helpers.runs.llama_3d.digest import parameter_names

    config = _config()
    model = build_model(config.model, config.moe, config.seed)
    assert parameter_names(config.model, config.moe) == [n for n, _ in model.named_parameters()]
    assert "blocks.3.mlp.experts.3.down_proj.weight" in parameter_names(config.model, config.moe)


def test_a_ranks_routing_is_read_from_every_ranks_history():
    """dp 2 x tp 2, one MoE layer, one forward per step: the matrices stack the dp peers'
    rows per expert; an expert reached by the tp peer's tokens only counts as trained;
    one reached in an earlier step only keeps its AdamW state."""
    from helpers.composed.experts import rank_routing

    coords = {r: {"pp": 0, "dp": r // 2, "cp": 0, "tp": r % 2} for r in range(4)}

    def load(arrived):
        return LayerLoad(tokens=4, arrived=arrived, kept=arrived)

    history = {  # per rank: per step, per layer, per forward: (rows per expert, load)
        0: [[[([1, 1, 1, 1], load((2, 0)))]], [[([2, 2, 0, 0], load((0, 0)))]]],
        1: [[[([1, 1, 1, 1], load((2, 2)))]], [[([2, 2, 0, 0], load((3, 0)))]]],
        2: [[[([0, 0, 2, 2], load((1, 1)))]], [[([4, 0, 0, 0], load((1, 1)))]]],
        3: [[[([0, 0, 2, 2], load((1, 1)))]], [[([0, 4, 0, 0], load((1, 1)))]]],
    }
    mine = rank_routing(history, coords, 0, timed=[1], microbatches=1)
    assert mine.ep_rank == 0 and torch.equal(mine.matrices[0][0],
                                             torch.tensor([[2, 2, 0, 0], [4, 0, 0, 0]]))
    assert mine.loads == [[load((0, 0))]]  # its own, last step
    assert (mine.trained, mine.kept) == (1, 2)  # expert 0 via rank 1 last step; expert 1 before
