"""Time as intervals: union, intersection, difference; a rank's four states and its overlap
share, proven on constructed ranks whose answers are known."""

from __future__ import annotations

import pytest

from helpers.debugging.intervals import clip, intersect, length, subtract, union
from helpers.debugging.overlap import KNOWN_CASES, breakdown


def test_union_merges_nested_touching_and_overlapping_intervals():
    assert union([(5, 9), (0, 2), (1, 3), (3, 4), (6, 7), (10, 10)]) == [(0, 4), (5, 9)]
    assert length([(0, 10), (2, 3), (5, 12)]) == 12


def test_intersect_and_subtract_split_time_between_two_sets():
    a, b = [(0, 10), (20, 30)], [(5, 25)]
    assert intersect(a, b) == [(5, 10), (20, 25)]
    assert subtract(a, b) == [(0, 5), (25, 30)]
    assert subtract(b, a) == [(10, 20)]
    assert clip(a, (8, 22)) == [(8, 10), (20, 22)]


def test_a_backwards_interval_is_refused():
    with pytest.raises(ValueError, match="ends before it starts"):
        union([(3, 1)])
    with pytest.raises(ValueError, match="no events and no window"):
        breakdown([], [])


@pytest.mark.parametrize("case", KNOWN_CASES, ids=[c.name for c in KNOWN_CASES])
def test_the_overlap_share_of_a_constructed_rank_is_its_known_answer(case):
    parts = breakdown(case.computing, case.communicating)
    assert abs(parts.overlap_share - case.overlap_share) <= 0.01  # one percentage point
    states = parts.computing_only + parts.communicating_only + parts.both + parts.idle
    assert states == pytest.approx(parts.window)


def test_a_window_counts_what_lies_outside_every_event_as_idle():
    parts = breakdown([(10, 20)], [(15, 30)], window=(0, 40))
    assert (parts.computing_only, parts.both, parts.communicating_only, parts.idle) == (
        5, 5, 10, 20)
    assert parts.overlap_share == pytest.approx(1 / 3) and parts.computing_share == 0.25
    assert parts.idle_share == 0.5
    assert breakdown([(0, 5)], [], window=(0, 10)).overlap_share == 0.0
