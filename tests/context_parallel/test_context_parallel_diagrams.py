"""The context-parallel pictures draw what the ring plans compute."""

from __future__ import annotations

import pytest

from helpers.context_parallel.diagrams import (
    causal_work_diagram,
    ring_attention_diagram,
    ulysses_diagram,
)
from helpers.core.drawing import LIGHT, rank_colour


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_the_causal_grid_colours_the_pieces_each_rank_computes(cp):
    d = causal_work_diagram(cp)
    cells = [b for b in d.boxes if b[2] == b[3] and b[2] < 2]  # the grids' square cells
    contiguous, zigzag = cells[: cp * cp], cells[cp * cp: cp * cp + 4 * cp * cp]
    assert sum(c[4] != LIGHT for c in contiguous) == cp * (cp + 1) // 2
    assert sum(c[4] != LIGHT for c in zigzag) == 2 * cp * (2 * cp + 1) // 2
    assert f"contiguous: pieces per rank {list(range(1, cp + 1))}" in d.labels
    assert f"zigzag: pieces per rank {[2 * cp + 1] * cp}" in d.labels


def test_the_ring_greys_the_steps_a_causal_rank_skips():
    d = ring_attention_diagram(4)
    assert sum("skip" in label for label in d.labels) == 6 and "6 of 16" in d.title
    assert sum("skip" in label for label in ring_attention_diagram(4, causal=False).labels) == 0
    assert [label for label in d.labels if label.startswith("KV")][:4] == ["KV0", "KV3 skip",
                                                                           "KV2 skip", "KV1 skip"]


def test_ulysses_moves_each_head_group_to_one_rank():
    d = ulysses_diagram(2, 4)
    after = [b[4] for b in d.boxes[8:]]
    assert after == [rank_colour(h // 2) for _ in range(2) for h in range(4)]


@pytest.mark.parametrize("call, match", [
    (lambda: causal_work_diagram(1), "cp=1; valid: an integer from 2 to 4"),
    (lambda: ring_attention_diagram(5), "cp=5"),
    (lambda: ulysses_diagram(2, 3), "heads=3 must be divisible by cp=2"),
])
def test_bad_sizes_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()
