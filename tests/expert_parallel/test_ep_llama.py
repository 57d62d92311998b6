"""One training step of the small Llama as a mixture of experts, with expert parallelism
beside data parallelism (ep = dp, torchtitan's dp2ep), on 2 and 4 thread ranks, equals one
process on the whole batch in float64: the same routing and drops, the loss, every
gradient (each expert's on the one rank that holds it), the weights after AdamW. With
ep < dp (experts replicated over two groups) it equals one process on the groups'
sub-batches as micro-batches. Two planted bugs fail by far: the experts' gradients
all-reduced like the rest, and the router's left unreduced.

Tolerance (chosen, not derived: the library's bound covers one MoE layer given its
inputs, not a whole model): the small Llama's budget of lesson 10, ``(tokens + 10 ranks)``
float64 epsilons of ``max(1, |largest value|)`` of each gradient and of the loss. The
weights' is derived from it: AdamW's first step moves a weight by ``lr g / (|g| + eps)``,
whose slope in ``g`` is ``eps / (|g| + eps)^2``, plus the two sides' roundings.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.expert_parallel import llama as ep_llama
from helpers.expert_parallel.bounds import U
from helpers.expert_parallel.dispatch import expert_range
from helpers.expert_parallel.llama import (
    aux_loss,
    batch_rows,
    expert_parallel,
    moe_layers,
    moe_llama,
    rank_loss,
    reduce_gradients,
)
from helpers.expert_parallel.moe import MoEShape
from helpers.models.llama import LMConfig
from helpers.runs.context_parallel.results import tolerance
from helpers.torchrun.in_notebook import run_mesh, run_ranks

LM = LMConfig(vocab=32, hidden=16, blocks=2, ffn=32, heads=2, kv_heads=1, rope=True)
SHAPE = MoEShape(hidden=16, ffn=24, experts=4, top_k=2, shared=True, capacity_factor=1.0)
BATCH, SEQ, AUX, LR, EPS = 4, 8, 0.1, 1e-2, 1e-8


def _inputs(seed: int = 0):
    model = moe_llama(LM, SHAPE, seed).double()
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, LM.vocab, (BATCH, SEQ), generator=g)
    return model, ids, torch.roll(ids, -1, dims=1)


def _optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS, weight_decay=0.1)


def _one_process(model, ids, targets, micro: int = 1) -> dict:
    """The reference: the whole batch in ``micro`` accumulated micro-batches."""
    model = copy.deepcopy(model)
    opt = _optimizer(model)
    loss, routes, kept = 0.0, [], []
    for part, want in zip(ids.chunk(micro), targets.chunk(micro), strict=True):
        logits = model(part)
        mine = F.cross_entropy(logits.reshape(-1, LM.vocab), want.reshape(-1)) \
            + AUX * aux_loss(model)
        (mine / micro).backward()
        loss = loss + mine.detach() / micro
        routes.append([m.last_routing.experts for m in moe_layers(model)])
        kept.append([torch.stack([(m.last_routing.experts == e)[m.last_routing.kept].sum()
                                  for e in range(SHAPE.experts)]) for m in moe_layers(model)])
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt.step()
    return {"loss": loss, "grads": grads, "routes": routes, "kept": kept,
            "weights": {n: p.detach().clone() for n, p in model.named_parameters()}}


def _rank_step(model, ids, targets, group, replicas=None) -> dict:
    model = expert_parallel(copy.deepcopy(model), group)
    opt = _optimizer(model)
    loss = rank_loss(model, model(batch_rows(ids, group, replicas)),
                     batch_rows(targets, group, replicas), AUX)
    loss.backward()
    counts = reduce_gradients(model, group, replicas)
    total = loss.detach().clone()
    for g in (group, replicas):
        if g is not None:
            dist.all_reduce(total, group=g)
    dp = group.size() * (replicas.size() if replicas is not None else 1)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt.step()
    return {"loss": total / dp, "grads": grads, "counts": counts,
            "routes": [m.last_routing.experts for m in moe_layers(model)],
            "kept": [m.last_splits.kept for m in moe_layers(model)],
            "weights": {n: p.detach().clone() for n, p in model.named_parameters()}}


def _raise(results: list) -> list:
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def _ratios(results: list[dict], want: dict, ep: int, ranks: int) -> dict[str, float]:
    """Each compared quantity's worst |got - want| / tolerance, over every rank."""
    tokens = BATCH * SEQ

    def allowed(g):
        return tolerance(tokens, ranks, g)

    ratios = {"loss": max(abs(r["loss"] - want["loss"]).item() / allowed(want["loss"])
                          for r in results)}
    for rank, result in enumerate(results):
        local = expert_range(SHAPE.experts, ep, rank % ep)
        for name, grad in result["grads"].items():
            if ".experts." in name:  # only this rank's experts, under their global numbers
                assert int(name.split(".experts.")[1].split(".")[0]) in local, name
            else:  # replicated: the same bits on every rank
                assert torch.equal(grad, results[0]["grads"][name]), name
            ref, dg = want["grads"][name], allowed(want["grads"][name])
            ratios[f"grad {name}"] = max(ratios.get(f"grad {name}", 0.0),
                                         (grad - ref).abs().max().item() / dg)
            slope = EPS / ((ref.abs() - dg).clamp(min=0) + EPS) ** 2
            w_ref = want["weights"][name]
            dw = LR * (dg * slope + 16 * U) + 2 * U * w_ref.abs()
            diff = (result["weights"][name] - w_ref).abs()
            ratios[f"weight {name}"] = max(ratios.get(f"weight {name}", 0.0),
                                           (diff / dw).max().item())
    experts = {n for r in results for n in r["grads"] if ".experts." in n}
    assert experts == {n for n in want["grads"] if ".experts." in n}  # every expert somewhere
    return ratios


def _same_routing(results: list[dict], want: dict, ep: int) -> None:
    """Each ep group chose the experts its micro-batch chose, and kept as many rows."""
    for g, group in enumerate([results[i:i + ep] for i in range(0, len(results), ep)]):
        for block in range(LM.blocks):
            chosen = torch.cat([r["routes"][block] for r in group])
            assert torch.equal(chosen, want["routes"][g][block])
            kept = torch.cat([r["kept"][block] for r in group])
            assert torch.equal(kept, want["kept"][g][block])


@pytest.mark.parametrize("ranks", [2, 4])
def test_dp2ep_step_equals_one_process_on_the_whole_batch(ranks):
    model, ids, targets = _inputs()
    want = _one_process(model, ids, targets)
    kept_rows = sum(int(k.sum()) for k in want["kept"][0])
    assert kept_rows < LM.blocks * BATCH * SEQ * SHAPE.top_k  # capacity dropped rows
    results = _raise(run_ranks(ranks, lambda r, g: _rank_step(model, ids, targets, g),
                               timeout=60))
    _same_routing(results, want, ranks)
    ratios = _ratios(results, want, ranks, ranks)
    assert max(ratios.values()) <= 1, {n: r for n, r in ratios.items() if r > 1}
    mine = {n: p.numel() for n, p in results[0]["grads"].items()}
    experts = sum(v for n, v in mine.items() if ".experts." in n)
    assert results[0]["counts"] == {"reduced": sum(mine.values()) - experts,
                                    "reduced_over_replicas": 0, "left_alone": experts}


def test_experts_replicated_over_two_groups_equal_micro_batches():
    """dp = 4, ep = 2: each expert on two ranks, one per ep group; each group routes its
    own half of the batch, as one process does with two micro-batches."""
    model, ids, targets = _inputs(seed=2)
    want = _one_process(model, ids, targets, micro=2)
    results = _raise(run_mesh({"replicas": 2, "ep": 2}, lambda r, g: _rank_step(
        model, ids, targets, g["ep"], g["replicas"]), timeout=60))
    _same_routing(results, want, 2)
    ratios = _ratios(results, want, 2, 4)
    assert max(ratios.values()) <= 1, {n: r for n, r in ratios.items() if r > 1}
    for rank in (0, 1):  # the two replicas of each expert hold the same summed gradient
        for name, grad in results[rank]["grads"].items():
            assert torch.equal(grad, results[rank + 2]["grads"][name]), name
    assert results[0]["counts"]["left_alone"] == 0 < results[0]["counts"]["reduced_over_replicas"]


def _all_reduced_like_the_rest(model):
    return list(model.named_parameters()), []


def _router_left_out(model):
    replicated, experts = _SPLIT(model)
    return [(n, p) for n, p in replicated if ".router." not in n], experts


_SPLIT = ep_llama.split_parameters


@pytest.mark.parametrize("bug, broken", [(_all_reduced_like_the_rest, "experts"),
                                         (_router_left_out, "router")])
def test_a_planted_reduction_bug_fails_by_far(monkeypatch, bug, broken):
    model, ids, targets = _inputs()
    want = _one_process(model, ids, targets)
    monkeypatch.setattr(ep_llama, "split_parameters", bug)
    results = _raise(run_ranks(2, lambda r, g: _rank_step(model, ids, targets, g), timeout=60))
    ratios = {n: max(r["grads"][n].sub(want["grads"][n]).abs().max().item()
                     / tolerance(BATCH * SEQ, 2, want["grads"][n]) for r in results
                     if n in r["grads"]) for n in want["grads"] if f".{broken}." in n}
    assert min(ratios.values()) > 1e6, ratios


def test_refusals_name_the_bad_value():
    with pytest.raises(ValueError, match="hidden=8 but the model's hidden=16; valid: hidden=16"):
        moe_llama(LM, MoEShape(8, 24, 4, 2))
    model, ids, _ = _inputs()
    with pytest.raises(ValueError, match="no auxiliary loss yet"):
        aux_loss(model)
    results = run_ranks(2, lambda r, g: batch_rows(ids[:3], g))
    assert all("batch of 3 rows for dp=2 ranks; valid: a multiple of 2" in str(x)
               for x in results)
