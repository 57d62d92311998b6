"""Time as sets of intervals: union, intersection, difference and length.

A rank's trace is a heap of events that nest and overlap (an operator inside a module,
a collective on another thread beside the backward). Asking "how long was it computing?"
means measuring the *union* of its computing events, never their sum: two events that
overlap count once. Every share the lesson prints is a length of such sets.
"""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The intervals merged: sorted, disjoint, touching ones joined; empty ones dropped."""
    merged: list[list[float]] = []
    for start, end in sorted((float(s), float(e)) for s, e in intervals):
        if end < start:
            raise ValueError(f"interval ({start}, {end}) ends before it starts; valid: "
                             "start <= end")
        if end == start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def length(intervals: Iterable[Interval]) -> float:
    """Total time covered (each instant once)."""
    return sum(e - s for s, e in union(intervals))


def intersect(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """The time covered by both ``a`` and ``b``."""
    left, right = union(a), union(b)
    out, i, j = [], 0, 0
    while i < len(left) and j < len(right):
        start, end = max(left[i][0], right[j][0]), min(left[i][1], right[j][1])
        if start < end:
            out.append((start, end))
        if left[i][1] < right[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """The time covered by ``a`` and not by ``b``."""
    out = []
    cut = union(b)
    for start, end in union(a):
        at = start
        for s, e in cut:
            if e <= at or s >= end:
                continue
            if s > at:
                out.append((at, s))
            at = max(at, e)
        if at < end:
            out.append((at, end))
    return out


def clip(intervals: Iterable[Interval], window: Interval) -> list[Interval]:
    """The intervals cut to ``window``."""
    return intersect(intervals, [window])
