"""The ring all-reduce diagram: drawn from a ring run on real tensors, checked against the
collectives' definition and the ring formula."""

from __future__ import annotations

import pytest

from helpers.comm import diagrams
from helpers.comm.collectives import ring_bytes
from helpers.comm.diagrams import ring_all_reduce_diagram, ring_all_reduce_steps
from helpers.core.drawing import rank_colour


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_the_ring_reduces_then_gathers_one_chunk_per_rank_per_step(n):
    steps = ring_all_reduce_steps(n)
    assert [s.phase for s in steps] == ["start"] + ["reduce-scatter"] * (n - 1) \
        + ["all-gather"] * (n - 1)
    everyone = frozenset(range(n))
    assert all(steps[0].holds[r][c] == {r} for r in range(n) for c in range(n))
    after_scatter = steps[n - 1].holds
    assert all(after_scatter[r][r] == everyone for r in range(n))  # rank r: the sum of chunk r
    assert all(c == everyone for row in steps[-1].holds for c in row)  # everyone: everything
    for step in steps[1:]:  # each rank sends one chunk, to its right neighbour
        assert sorted(src for src, _, _ in step.sends) == list(range(n))
        assert all(dst == (src + 1) % n for src, dst, _ in step.sends)
    sends = sum(len(s.sends) for s in steps)
    assert sends / n == 2 * (n - 1) == ring_bytes("all_reduce", n, n)  # chunks of one element


def test_the_ring_checks_itself_against_the_ring_formula(monkeypatch):
    monkeypatch.setattr(diagrams, "ring_bytes", lambda *args: 0.0)
    with pytest.raises(AssertionError):
        ring_all_reduce_steps(3)


def test_the_diagram_draws_every_chunk_and_one_arrow_per_send():
    n = 4
    d = ring_all_reduce_diagram(n)
    steps = ring_all_reduce_steps(n)
    assert d.arrows == sum(len(s.sends) for s in steps) == 2 * n * (n - 1)
    chunks = [b for b in d.boxes if b[4] in {rank_colour(c) for c in range(n)}]
    assert len(chunks) == len(steps) * n * n
    assert [f"rank {r}" for r in range(n)] == [lab for lab in d.labels if lab.startswith("rank")]
    assert d.labels.count("Σ") == sum(len(c) == n for s in steps for row in s.holds for c in row)
    assert "0+1+2" in d.labels  # a partial sum, named by the ranks in it
    assert f"{2 * (n - 1)} chunks of 1/{n}" in d.title


@pytest.mark.parametrize("bad", [1, 5, "4", True, 2.0])
def test_bad_world_sizes_are_refused_by_name(bad):
    with pytest.raises(ValueError, match=rf"world_size={bad!r}; valid: an integer from 2 to 4"):
        ring_all_reduce_diagram(bad)
