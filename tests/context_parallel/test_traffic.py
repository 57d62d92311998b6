"""The bytes each rank sends per attention layer, counted on the ranks, equal the formulas."""

from __future__ import annotations

import pytest
import torch

from helpers.comm.meter import CommMeter
from helpers.context_parallel.gather import allgather_attention, ulysses_attention
from helpers.context_parallel.ring import ring_attention
from helpers.context_parallel.split import shard
from helpers.context_parallel.traffic import AttentionShape, layer_traffic
from helpers.torchrun.in_notebook import run_ranks

SHAPE = AttentionShape(batch=2, seq=16, heads=4, kv_heads=2, head_dim=8, element_bytes=8)
FUNCTIONS = {"ring": (ring_attention, "contiguous"), "zigzag": (ring_attention, "zigzag"),
             "allgather": (allgather_attention, "contiguous"),
             "ulysses": (ulysses_attention, "contiguous")}


def _counted(variant: str, cp: int):
    attention, split = FUNCTIONS[variant]
    s = SHAPE
    torch.manual_seed(0)
    q = torch.randn(s.batch, s.heads, s.seq, s.head_dim, dtype=torch.float64)
    k, v = (torch.randn(s.batch, s.kv_heads, s.seq, s.head_dim, dtype=torch.float64)
            for _ in range(2))

    def work(rank, group):
        ql, kl, vl = (shard(t, rank, cp, split).requires_grad_() for t in (q, k, v))
        with CommMeter(sends=True) as forward:
            out = attention(ql, kl, vl, group, split, True)
        with CommMeter(sends=True) as backward:
            out.backward(torch.ones_like(out))
        return forward, backward

    return run_ranks(cp, work, timeout=60, raise_errors=True)


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("variant", list(FUNCTIONS))
def test_each_rank_sends_what_the_formula_says(variant, cp):
    if variant == "ulysses" and SHAPE.kv_heads % cp:
        pytest.skip("Ulysses needs the key/value heads divisible by cp")
    ring, gloo = layer_traffic(variant, SHAPE, cp), layer_traffic(variant, SHAPE, cp, gloo=True)
    for forward, backward in _counted(variant, cp):
        assert forward.total_ring == ring.forward and backward.total_ring == ring.backward
        assert forward.total_gloo == gloo.forward and backward.total_gloo == gloo.backward


def test_ring_grows_with_cp_ulysses_does_not():
    sent = {v: [layer_traffic(v, AttentionShape(1, 1024, 8, 8, 64), cp).step for cp in (2, 4, 8)]
            for v in ("ring", "ulysses")}
    assert sent["ring"][0] < sent["ring"][1] < sent["ring"][2]
    assert sent["ulysses"][2] < sent["ulysses"][0]


def test_one_rank_sends_nothing_and_bad_input_is_refused():
    assert layer_traffic("ring", SHAPE, 1).step == 0
    with pytest.raises(ValueError, match="variant='stripes'; valid: ring, zigzag"):
        layer_traffic("stripes", SHAPE, 2)
    with pytest.raises(ValueError, match="cp=3 must divide seq=16"):
        layer_traffic("ring", SHAPE, 3)
