"""A Llama block (GQA, RoPE) split by heads and MLP width: simulated, then on thread ranks.

Tolerance 1e-5 throughout: the split computes the same float32 products as the full
block but adds them up in another order (o and down sum the ranks' partial terms), a
few units in the last place of values of order 1.
"""

import pytest
import torch

from helpers.models.attention import GQAAttention, rope
from helpers.models.llama import Block
from helpers.tensor_parallel import transformer_block
from helpers.tensor_parallel.attention_shards import head_ranges
from helpers.tensor_parallel.transformer_block import (
    TPBlock,
    format_split,
    shard_block,
    simulate_tp_block,
    split_weights,
)
from helpers.torchrun.in_notebook import run_ranks

TOL = 1e-5
HIDDEN, FFN, HEADS, KV_HEADS = 64, 128, 8, 4


def _block(rope_on=True, kv_heads=KV_HEADS):
    torch.manual_seed(0)
    block = Block(HIDDEN, FFN, HEADS, kv_heads, rope=rope_on)
    with torch.no_grad():  # norm weights away from 1, so their gradients are tested
        for norm in (block.attn_norm, block.mlp_norm):
            norm.weight.uniform_(0.5, 1.5)
    return block


def _input(seed=1):
    return torch.randn(2, 6, HIDDEN, generator=torch.Generator().manual_seed(seed))


def _diff(a, b):
    return (a.detach().double() - b.detach().double()).abs().max().item()


def test_rope_changes_the_block_and_kv_heads_shrink_k_and_v():
    torch.manual_seed(3)
    plain = Block(HIDDEN, FFN, HEADS)
    turned = Block(HIDDEN, FFN, HEADS, rope=True)
    turned.load_state_dict(plain.state_dict())
    x = _input()
    assert _diff(turned(x)[:, 0], plain(x)[:, 0]) <= 1e-6  # position 0 is not turned
    assert _diff(turned(x), plain(x)) > 1e-3
    assert Block(HIDDEN, FFN, HEADS, KV_HEADS).attn.k_proj.weight.shape == (HIDDEN // 2, HIDDEN)


def test_gqa_is_attention_with_each_kv_head_repeated():
    torch.manual_seed(4)
    gqa, mha = GQAAttention(HIDDEN, HEADS, KV_HEADS), GQAAttention(HIDDEN, HEADS, HEADS)
    head_dim, group = HIDDEN // HEADS, HEADS // KV_HEADS
    with torch.no_grad():
        for name in ("q_proj", "o_proj"):
            getattr(mha, name).weight.copy_(getattr(gqa, name).weight)
        for name in ("k_proj", "v_proj"):
            heads = getattr(gqa, name).weight.view(KV_HEADS, head_dim, HIDDEN)
            getattr(mha, name).weight.copy_(heads.repeat_interleave(group, 0).reshape(HIDDEN, -1))
    x = _input()
    assert _diff(gqa(x), mha(x)) <= 1e-6


def test_rope_keeps_position_zero_and_lengths_and_sees_only_offsets():
    generator = torch.Generator().manual_seed(5)
    q = torch.randn(16, generator=generator).expand(1, 1, 8, 16)  # one vector, every position
    turned = rope(q)
    assert torch.equal(turned[..., 0, :], q[..., 0, :])
    assert _diff(turned.norm(dim=-1), q.norm(dim=-1)) <= 1e-5
    scores = turned[0, 0] @ turned[0, 0].T  # the same vector against itself, shifted
    assert _diff(scores[2, 0], scores[5, 3]) <= 1e-4  # float32 scores of order 10
    assert _diff(scores[1, 0], scores[2, 0]) > 1e-3


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_simulation_equals_the_full_block(tp):
    block, x = _block(), _input()
    with torch.no_grad():
        assert _diff(simulate_tp_block(block, x, tp), block(x)) <= TOL


def test_split_weights_of_rank_1_of_2():
    cuts = split_weights(_block(), 1, 2)
    assert str(cuts["attn.q_proj.weight"]) == "rows 32:64 of 64"
    assert str(cuts["attn.k_proj.weight"]) == "rows 16:32 of 32"
    assert str(cuts["attn.o_proj.weight"]) == "columns 32:64 of 64"
    assert str(cuts["mlp.down_proj.weight"]) == "columns 64:128 of 128"
    assert str(cuts["mlp_norm.weight"]) == "replicated"
    assert head_ranges(HEADS, KV_HEADS, 2, 1) == (range(4, 8), range(2, 4))
    assert "rank 1" in format_split(_block(), 2)


def test_each_shard_holds_its_slices():
    block = _block()
    full = dict(block.named_parameters())
    for rank in range(4):
        shard = dict(shard_block(block, rank, 4).named_parameters())
        for name, cut in split_weights(block, rank, 4).items():
            assert torch.equal(shard[name], cut.take(full[name]))


def _reference(block, x, weight):
    x = x.clone().requires_grad_()
    out = block(x)
    (out * weight).sum().backward()
    return out.detach(), x.grad, {n: p.grad for n, p in block.named_parameters()}


def _on_ranks(block, x, weight, tp):
    shards = [shard_block(block, rank, tp) for rank in range(tp)]

    def work(rank, group):
        mine = x.clone().requires_grad_()
        out = shards[rank](mine, group)
        (out * weight).sum().backward()  # the same loss on every rank, from the same output
        return out.detach(), mine.grad, {n: p.grad for n, p in shards[rank].named_parameters()}

    return run_ranks(tp, work, timeout=30, raise_errors=True)


@pytest.mark.parametrize("tp", [2, 4])
def test_thread_ranks_match_the_full_block_forward_and_backward(tp):
    block, x = _block(), _input()
    weight = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    out, x_grad, grads = _reference(block, x, weight)
    results = _on_ranks(block, x, weight, tp)
    for rank, (rank_out, rank_x_grad, rank_grads) in enumerate(results):
        assert _diff(rank_out, out) <= TOL
        assert _diff(rank_x_grad, x_grad) <= TOL
        for name, cut in split_weights(block, rank, tp).items():
            assert _diff(rank_grads[name], cut.take(grads[name])) <= TOL, (rank, name)
    for name in ("attn_norm.weight", "mlp_norm.weight"):  # replicated: same on every rank
        assert all(torch.equal(r[2][name], results[0][2][name]) for r in results), name


def test_without_f_the_replicated_norms_get_different_gradients(monkeypatch):
    """f's backward all-reduce is what makes the norm gradients whole and equal."""
    block, x = _block(), _input()
    weight = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    _, _, grads = _reference(block, x, weight)
    monkeypatch.setattr(transformer_block, "f", lambda t, group=None: t)
    results = _on_ranks(block, x, weight, 2)
    for name in ("attn_norm.weight", "mlp_norm.weight"):
        assert _diff(results[0][2][name], results[1][2][name]) > 1e-2, name
        assert _diff(results[0][2][name], grads[name]) > 1e-2, name


@pytest.mark.parametrize(
    ("heads", "kv_heads", "ffn", "tp", "named"),
    [
        (8, 4, 128, 8, ["kv_heads=4", "tp=8", "valid tp: 1, 2, 4"]),
        (8, 8, 128, 3, ["heads=8", "tp=3", "valid tp: 1, 2, 4, 8"]),
        (8, 2, 96, 4, ["kv_heads=2", "valid tp: 1, 2"]),
        (8, 8, 100, 8, ["ffn=100", "tp=8", "valid tp for heads=8, kv_heads=8, ffn=100: 1, 2, 4"]),
        (8, 8, 128, 0, ["tp=0"]),
    ],
)
def test_refuses_a_tp_that_does_not_split_evenly(heads, kv_heads, ffn, tp, named):
    block = Block(HIDDEN, ffn, heads, kv_heads)
    for call in (lambda: split_weights(block, 0, tp), lambda: shard_block(block, 0, tp)):
        with pytest.raises(ValueError) as error:
            call()
        assert all(part in str(error.value) for part in named), str(error.value)


@pytest.mark.parametrize(
    ("sizes", "named"),
    [((60, 8, 4), "hidden=60"), ((64, 8, 3), "kv_heads=3"), ((64, 0, 1), "heads=0")],
)
def test_refuses_shapes_that_do_not_split_into_heads(sizes, named):
    hidden, heads, kv_heads = sizes
    with pytest.raises(ValueError, match=named):
        Block(hidden, FFN, heads, kv_heads)


def test_refuses_a_bad_rank_and_a_missing_group():
    block = _block()
    with pytest.raises(ValueError, match="rank=2"):
        TPBlock(block, 2, 2)
    with pytest.raises(ValueError, match="group=None"):
        shard_block(block, 0, 2)(_input())
    one = shard_block(block, 0, 1)
    with torch.no_grad():
        assert _diff(one(_input()), block(_input())) == 0.0
