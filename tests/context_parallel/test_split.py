"""The contiguous and zig-zag splits: who holds which tokens, and the causal work each does."""

from __future__ import annotations

import pytest
import torch

from helpers.context_parallel.split import causal_work, chunks_of, positions, shard, unshard


def test_zigzag_pairs_a_cheap_chunk_with_a_dear_one():
    assert [chunks_of(r, 4, "zigzag") for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert positions(1, 2, 8, "zigzag").tolist() == [2, 3, 4, 5]
    assert positions(0, 2, 8, "zigzag").tolist() == [0, 1, 6, 7]
    assert positions(1, 2, 8, "contiguous").tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("split", ["contiguous", "zigzag"])
def test_every_token_is_held_once_and_comes_back_in_order(split):
    x = torch.arange(2 * 3 * 16).reshape(2, 3, 16, 1)
    parts = [shard(x, r, 4, split) for r in range(4)]
    assert sorted(torch.cat([positions(r, 4, 16, split) for r in range(4)]).tolist()) == list(range(16))
    assert torch.equal(unshard(parts, 4, split), x)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_contiguous_rank_r_computes_r_plus_1_blocks_zigzag_the_same_for_all(cp):
    seq = 16 * cp
    block = (seq // cp) ** 2
    assert [causal_work(r, cp, seq, "contiguous") for r in range(cp)] == [
        (r + 1) * block for r in range(cp)]
    zigzag = {causal_work(r, cp, seq, "zigzag") for r in range(cp)}
    assert len(zigzag) == 1
    # 2cp chunks: rank r's chunks r and 2cp-1-r see r+1 and 2cp-r chunks: 2cp+1 in all
    assert zigzag == {(2 * cp + 1) * (seq // (2 * cp)) ** 2}


@pytest.mark.parametrize("call, match", [
    (lambda: chunks_of(0, 2, "striped"), "split='striped'; valid: contiguous, zigzag"),
    (lambda: chunks_of(2, 2, "zigzag"), "rank=2 with cp=2"),
    (lambda: positions(0, 2, 6, "zigzag"), "seq=6 is not divisible into 4 chunks"),
])
def test_bad_input_names_the_value_and_the_choices(call, match):
    with pytest.raises(ValueError, match=match):
        call()
