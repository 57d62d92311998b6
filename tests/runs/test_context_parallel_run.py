"""The context-parallel run: its refusals before any launch, and one launch under torchrun."""

from __future__ import annotations

import pytest

from helpers.runs.context_parallel.config import CPAttentionConfig
from helpers.runs.context_parallel.results import CPAttentionResult
from helpers.runs.contract import launch


@pytest.mark.parametrize("config, world, match", [
    (CPAttentionConfig(variant="stripes"), 2, "variant='stripes'; valid: ring, zigzag"),
    (CPAttentionConfig(variant="zigzag", seq=6), 2, "seq=6 is not divisible into 4 chunks"),
    (CPAttentionConfig(variant="ulysses", kv_heads=1), 2, "needs --heads 4 and --kv-heads 1"),
    (CPAttentionConfig(cp=4), 2, "--cp 4 but the world size is 2"),
    (CPAttentionConfig(heads=3), 2, "--hidden 64 is not divisible by --heads 3"),
    (CPAttentionConfig(kv_heads=3), 2, "--heads 4 is not a multiple of --kv-heads 3"),
])
def test_bad_input_is_refused_naming_the_value_and_the_choices(config, world, match):
    with pytest.raises(ValueError, match=match):
        config.validate(world)


def test_flags_round_trip():
    config = CPAttentionConfig(variant="ulysses", cp=2, causal=True, seq=32)
    assert CPAttentionConfig.from_args(config.args()) == config


@pytest.mark.twin
@pytest.mark.torchrun
def test_ring_on_torchrun_is_proven_counted_and_unbalanced_zigzag_balanced():
    ring = launch(CPAttentionConfig(causal=True, repeats=1, warmup=0), nproc=2, timeout=180)
    assert isinstance(ring, CPAttentionResult) and ring.proven.ok and ring.bytes_as_predicted
    assert [r.scores for r in ring.ranks] == [32 * 32, 2 * 32 * 32]  # rank r: r + 1 blocks
    assert all(r.wire_sent is None or r.wire_sent >= r.forward_gloo + r.backward_gloo
               for r in ring.ranks)
    zigzag = launch(CPAttentionConfig(variant="zigzag", causal=True, repeats=1, warmup=0,
                                      native=True), nproc=2, timeout=180)
    assert zigzag.proven.ok and zigzag.imbalance == 1.0
    # PyTorch's own context_parallel() has no ring for the CPU's attention kernel
    assert not zigzag.native.ran and "_scaled_dot_product_flash_attention_for_cpu" in zigzag.native.error
