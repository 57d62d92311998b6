"""A training step of the small Llama with context parallelism equals one process's."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from helpers.context_parallel import llama as cp_llama
from helpers.context_parallel.llama import context_parallel, local_loss, sum_gradients, tokens_of
from helpers.models.llama import LMConfig, build_lm
from helpers.torchrun.in_notebook import run_ranks

CONFIG = LMConfig(vocab=48, hidden=32, blocks=2, ffn=64, heads=4, kv_heads=2, rope=True)
TOL = 1e-12  # chosen: float64, sums over 32 tokens and a few layers; a lost block is O(1e-2)


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, CONFIG.vocab, (2, 16), generator=g)
    return ids, torch.roll(ids, -1, dims=1)


def _reference():
    model = build_lm(CONFIG).double()
    ids, targets = _batch()
    loss = F.cross_entropy(model(ids).reshape(-1, CONFIG.vocab), targets.reshape(-1))
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _parallel(variant: str, cp: int):
    ids, targets = _batch()
    built = build_lm(CONFIG).double()  # once: build_lm seeds the global generator, which
    # threads would share

    def work(rank, group):
        model = context_parallel(copy.deepcopy(built), group, variant)
        local = tokens_of(ids, group, variant)
        loss = local_loss(model(local), tokens_of(targets, group, variant), ids.numel())
        loss.backward()
        sum_gradients(model, group)
        total = loss.detach().clone()
        torch.distributed.all_reduce(total, group=group)
        return total.item(), {n: p.grad.clone() for n, p in model.named_parameters()}

    return run_ranks(cp, work, timeout=60, raise_errors=True)


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("variant", ["ring", "zigzag", "allgather", "ulysses"])
def test_a_step_with_context_parallelism_equals_one_process(variant, cp):
    if variant == "ulysses" and CONFIG.kv % cp:
        pytest.skip("Ulysses needs the key/value heads divisible by cp")
    loss, grads = _reference()
    for got_loss, got_grads in _parallel(variant, cp):
        assert abs(got_loss - loss) < TOL
        assert max((got_grads[n] - g).abs().max().item() for n, g in grads.items()) < TOL


def test_rotary_positions_must_follow_the_split(monkeypatch):
    """A rank that turns its tokens by their row, not their true position, is caught."""
    monkeypatch.setattr(cp_llama, "positions", lambda rank, cp, seq, split: torch.arange(seq // cp))
    loss, grads = _reference()
    got_loss, got_grads = _parallel("zigzag", 2)[0]
    assert max((got_grads[n] - g).abs().max().item() for n, g in grads.items()) > 1e-6


@pytest.mark.parametrize("variant", ["ring", "zigzag"])
def test_context_and_tensor_parallelism_on_four_ranks_equal_one_process(variant):
    """cp 2 x tp 2: each tp rank's shard gradients, summed over its cp group, are the slices
    of one process's gradients."""
    from helpers.tensor_parallel.llama import TPLlama, model_cuts
    from helpers.torchrun.in_notebook import run_mesh

    ids, targets = _batch()
    built = build_lm(CONFIG).double()
    loss, grads = _reference()

    def work(rank, groups):
        cp_group, tp_group = groups["cp"], groups["tp"]
        shard = context_parallel(TPLlama(copy.deepcopy(built), tp_group.rank(), 2), cp_group,
                                 variant)
        local_ids, local_targets = tokens_of(ids, cp_group, variant), tokens_of(targets, cp_group, variant)
        share = shard.loss(shard.logits(local_ids, tp_group), local_targets, tp_group)
        share = share * local_ids.numel() / ids.numel()  # this cp rank's share of the mean
        share.backward()
        sum_gradients(shard, cp_group)
        total = share.detach().clone()
        torch.distributed.all_reduce(total, group=cp_group)
        cuts = model_cuts(built, tp_group.rank(), 2)
        worst = max((cuts[n].own(p.grad) - cuts[n].take(grads[n])).abs().max().item()
                    for n, p in shard.named_parameters())
        return abs(total.item() - loss), worst

    for result in run_mesh({"cp": 2, "tp": 2}, work, raise_errors=True):
        assert result[0] < TOL and result[1] < TOL
