"""One training step of the small Llama as a mixture of experts, with expert parallelism
beside data parallelism (ep = dp, torchtitan's dp2ep), on 2 and 4 thread ranks, equals one
process on the whole batch in float64: the same routing and drops, the loss, every
gradient (each expert's on the one rank that holds it), the weights after AdamW. With
ep < dp (experts replicated over two groups) it equals one process on the groups'
sub-batches as micro-batches. Two planted bugs fail by far: the experts' gradients
all-reduced like the rest, and the router's left unreduced. The tolerances are
``helpers.runs.expert_parallel.thread_runs``'s (chosen for the loss and gradients, the
weights' derived from them through AdamW).
"""

from __future__ import annotations

import pytest
import torch

from helpers.expert_parallel import llama as ep_llama
from helpers.expert_parallel.llama import aux_loss, batch_rows, moe_llama
from helpers.expert_parallel.moe import MoEShape
from helpers.models.llama import LMConfig
from helpers.runs.expert_parallel.thread_runs import prove_step
from helpers.torchrun.in_notebook import run_ranks

LM = LMConfig(vocab=32, hidden=16, blocks=2, ffn=32, heads=2, kv_heads=1, rope=True)
SHAPE = MoEShape(hidden=16, ffn=24, experts=4, top_k=2, shared=True, capacity_factor=1.0)
BATCH, SEQ = 4, 8


def _inputs(seed: int = 0):
    model = moe_llama(LM, SHAPE, seed).double()
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, LM.vocab, (BATCH, SEQ), generator=g)
    return model, ids, torch.roll(ids, -1, dims=1)


@pytest.mark.parametrize("ranks", [2, 4])
def test_dp2ep_step_equals_one_process_on_the_whole_batch(ranks):
    model, ids, targets = _inputs()
    proof = prove_step("dp2ep", model, ids, targets, dp=ranks)
    kept_rows = sum(int(k.sum()) for k in proof.want["kept"][0])
    assert kept_rows < LM.blocks * BATCH * SEQ * SHAPE.top_k  # capacity dropped rows
    assert proof.verdict.ok, proof.verdict.table()
    assert proof.same_routing(ranks)
    for name, grad in proof.results[1]["grads"].items():  # replicated: the same bits
        if ".experts." not in name:
            assert torch.equal(grad, proof.results[0]["grads"][name]), name
    mine = {n: p.numel() for n, p in proof.results[0]["grads"].items()}
    experts = sum(v for n, v in mine.items() if ".experts." in n)
    assert proof.results[0]["counts"] == {"reduced": sum(mine.values()) - experts,
                                          "reduced_over_replicas": 0, "left_alone": experts}


def test_experts_replicated_over_two_groups_equal_micro_batches():
    """dp = 4, ep = 2: each expert on two ranks, one per ep group; each group routes its
    own half of the batch, as one process does with two micro-batches."""
    model, ids, targets = _inputs(seed=2)
    proof = prove_step("ep 2 of dp 4", model, ids, targets, dp=4, ep=2)
    assert proof.verdict.ok, proof.verdict.table()
    assert proof.same_routing(2)
    for rank in (0, 1):  # the two replicas of each expert hold the same summed gradient
        for name, grad in proof.results[rank]["grads"].items():
            assert torch.equal(grad, proof.results[rank + 2]["grads"][name]), name
    counts = proof.results[0]["counts"]
    assert counts["left_alone"] == 0 < counts["reduced_over_replicas"]


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
    monkeypatch.setattr(ep_llama, "split_parameters", bug)
    proof = prove_step("broken", model, ids, targets, dp=2)
    misses = [p.max_diff / p.tolerance for p in proof.verdict.proofs
              if p.what.startswith("grad ") and f".{broken}." in p.what]
    assert misses and min(misses) > 1e6, misses


def test_refusals_name_the_bad_value():
    with pytest.raises(ValueError, match="hidden=8 but the model's hidden=16; valid: hidden=16"):
        moe_llama(LM, MoEShape(8, 24, 4, 2))
    model, ids, _ = _inputs()
    with pytest.raises(ValueError, match="no auxiliary loss yet"):
        aux_loss(model)
    results = run_ranks(2, lambda r, g: batch_rows(ids[:3], g))
    assert all("batch of 3 rows for dp=2 ranks; valid: a multiple of 2" in str(x)
               for x in results)
