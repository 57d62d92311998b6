"""Context-parallel attention on real gloo ranks equals one device's attention.

Each variant (ring over the contiguous and the zig-zag split, all-gathered keys and values,
Ulysses) runs forward and backward on 2 and 4 in-process ranks in float64, against
``F.scaled_dot_product_attention`` on the whole sequence: outputs and the gradients of the
queries, keys and values, each within the rounding bound derived from the inputs
(``helpers.context_parallel.bounds``); a wrong position or a lost block is off by O(1).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.context_parallel import ring as ring_module
from helpers.context_parallel.bounds import QUANTITIES, attention_bounds, output_bound
from helpers.context_parallel.gather import allgather_attention, ulysses_attention
from helpers.context_parallel.merge import blockwise_attention
from helpers.context_parallel.ring import ring_attention
from helpers.context_parallel.split import shard, unshard
from helpers.torchrun.in_notebook import run_ranks

B, H, KVH, S, D = 2, 4, 2, 16, 8


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    return make(B, H, S, D), make(B, KVH, S, D), make(B, KVH, S, D), make(B, H, S, D)


def _reference(q, k, v, dout, causal):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), dout))


def _parallel(attention, q, k, v, dout, cp, split, causal):
    def work(rank, group):
        ql, kl, vl = (shard(t, rank, cp, split).requires_grad_() for t in (q, k, v))
        out = attention(ql, kl, vl, group, split, causal)
        out.backward(shard(dout, rank, cp, split))
        return out.detach(), ql.grad, kl.grad, vl.grad

    results = run_ranks(cp, work, timeout=60, raise_errors=True)
    return [unshard([r[i] for r in results], cp, split) for i in range(4)]


def _within_bounds(got, want, bounds) -> bool:
    return all((a - b).abs().max().item() <= bounds[name]
               for name, a, b in zip(QUANTITIES, got, want, strict=True))


def _worst(got, want) -> float:
    return max((a - b).abs().max().item() for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("causal", [True, False])
def test_blocks_merged_by_their_log_sum_exp_are_full_attention(causal):
    q, k, v, _ = _inputs()
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    for blocks in (1, 2, 4, 16):
        diff = (blockwise_attention(q, k, v, blocks, causal) - want).abs().max().item()
        assert diff <= output_bound(q, k, v, causal)


def test_blockwise_refuses_blocks_that_do_not_divide_the_keys():
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match="blocks=3"):
        blockwise_attention(q, k, v, 3)


VARIANTS = [(ring_attention, "contiguous"), (ring_attention, "zigzag"),
            (allgather_attention, "contiguous"), (allgather_attention, "zigzag"),
            (ulysses_attention, "contiguous"), (ulysses_attention, "zigzag")]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("attention, split", VARIANTS,
                         ids=[f"{a.__name__.split('_')[0]}-{s}" for a, s in VARIANTS])
def test_each_variant_equals_one_device_forward_and_backward(attention, split, cp, causal):
    if attention is ulysses_attention and KVH % cp:
        pytest.skip("Ulysses needs the key/value heads divisible by cp")
    q, k, v, dout = _inputs()
    got = _parallel(attention, q, k, v, dout, cp, split, causal)
    want = _reference(q, k, v, dout, causal)
    assert _within_bounds(got, want, attention_bounds(q, k, v, dout, causal))


def test_a_planted_bug_fails_the_proof(monkeypatch):
    """Ring attention that takes every key block for its own (wrong positions) is caught."""
    q, k, v, dout = _inputs()
    monkeypatch.setattr(ring_module.RingPlan, "owner", lambda self, step: self.rank)
    got = _parallel(ring_attention, q, k, v, dout, 2, "contiguous", True)
    want = _reference(q, k, v, dout, True)
    assert not _within_bounds(got, want, attention_bounds(q, k, v, dout, True))
    assert _worst(got, want) > 1e-2


def test_ulysses_refuses_heads_the_ranks_cannot_divide():
    q, k, v, _ = _inputs()

    def work(rank, group):
        ql, kl, vl = (shard(t, rank, 4, "contiguous") for t in (q, k, v))
        return ulysses_attention(ql, kl[:, :1], vl[:, :1], group)

    results = run_ranks(4, work, timeout=30)
    assert all(isinstance(r, ValueError) and "divisible by cp=4" in str(r) for r in results)
