"""The pictures of this technique, drawn from the objects the lesson runs.

``ring_all_reduce_diagram`` draws a ring all-reduce step by step: the reduce-scatter, then
the all-gather. It draws what :func:`ring_all_reduce_steps` computed, a ring run on real
tensors with the chunking of :mod:`helpers.comm.collectives` (rank r's chunk r of a flat
tensor of ``N`` chunks), and checked there against ``expected_result`` and ``ring_bytes``:
the picture cannot say what the collective does not do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from helpers.comm.collectives import expected_result, rank_input, ring_bytes
from helpers.core.drawing import GREY, Diagram, rank_colour

MAX_RANKS = 4  # the most a ring diagram draws legibly in the output area's width


@dataclass(frozen=True)
class RingStep:
    """One step of a ring all-reduce: who sent which chunk to whom, then what each holds.

    ``holds[r][c]`` is the set of ranks whose chunk ``c`` is summed into rank r's chunk c.
    """

    phase: str  # "start", "reduce-scatter" or "all-gather"
    step: int  # 1 to N - 1 within its phase (0 for the start)
    sends: tuple[tuple[int, int, int], ...]  # (from rank, to rank, chunk)
    holds: tuple[tuple[frozenset[int], ...], ...]


def _validate(world_size: object, most: int) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) \
            or not 2 <= world_size <= most:
        raise ValueError(f"world_size={world_size!r}; valid: an integer from 2 to {most}")
    return world_size


def ring_all_reduce_steps(world_size: int) -> list[RingStep]:
    """A ring all-reduce of one chunk per rank, run on real tensors, step by step.

    Reduce-scatter step s (0-based): rank r sends its running sum of chunk (r - s - 1) to
    rank r + 1, which adds it to its own. After N - 1 steps rank r holds the sum of chunk r,
    as ``reduce_scatter`` gives it. All-gather step s: rank r sends the finished chunk
    (r - s) to rank r + 1, which keeps it. Raises AssertionError if the result differs
    from ``expected_result`` or a rank sent other than ``ring_bytes``.
    """
    n = _validate(world_size, 64)
    inputs = [rank_input(r, n) for r in range(n)]  # one element per chunk: exact sums
    data = [list(t.clone().chunk(n)) for t in inputs]
    holds = [[{r} for _ in range(n)] for r in range(n)]
    sent = [0] * n

    def record(phase: str, step: int, sends: list[tuple[int, int, int]]) -> RingStep:
        return RingStep(phase, step, tuple(sends),
                        tuple(tuple(frozenset(h) for h in row) for row in holds))

    steps = [record("start", 0, [])]
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(n - 1):
            shift = s + 1 if phase == "reduce-scatter" else s
            sends = [(r, (r + 1) % n, (r - shift) % n) for r in range(n)]
            outgoing = [(data[src][c].clone(), set(holds[src][c])) for src, _, c in sends]
            for (src, dst, c), (chunk, who) in zip(sends, outgoing, strict=True):
                sent[src] += chunk.numel() * chunk.element_size()
                if phase == "reduce-scatter":
                    data[dst][c] += chunk
                    holds[dst][c] |= who
                else:
                    data[dst][c] = chunk
                    holds[dst][c] = who
            steps.append(record(phase, s + 1, sends))
        if phase == "reduce-scatter":
            for r in range(n):
                assert torch.equal(data[r][r], expected_result("reduce_scatter", inputs, r))
    for r in range(n):
        assert torch.equal(torch.cat(data[r]), expected_result("all_reduce", inputs, r))
        full = inputs[r].numel() * inputs[r].element_size()
        assert sent[r] == ring_bytes("all_reduce", n, full)
    return steps


def _label(who: frozenset[int], n: int) -> str:
    return "Σ" if len(who) == n else "+".join(map(str, sorted(who)))


def _steps(k: int, phase: str) -> str:
    """E.g. "3 reduce-scatter steps leave", "1 all-gather step passes"."""
    if k > 1:
        return f"{k} {phase} steps {'leave' if phase == 'reduce-scatter' else 'pass'}"
    return f"1 {phase} step {'leaves' if phase == 'reduce-scatter' else 'passes'}"


def ring_all_reduce_diagram(world_size: int = 4) -> Diagram:
    """Each rank's chunks after every step of a ring all-reduce, and the chunk each sends."""
    n = _validate(world_size, MAX_RANKS)
    steps = ring_all_reduce_steps(n)
    cw, gap, lead = 0.5, 0.06, 2.3  # chunk width, gap between chunks, the labels' column
    col = n * cw + (n - 1) * gap + 0.35  # one rank's column, with the gap after it
    rh, rg = 0.42, 0.5  # row height, gap between rows (for the arrows)
    width = max(lead + n * col + 0.9, 10.5)  # at least the title's width
    height = 0.9 + len(steps) * rh + (len(steps) - 1) * rg + 0.5
    d = Diagram(width, height, (
        f"Ring all-reduce on {n} ranks: {_steps(n - 1, 'reduce-scatter')} rank r the sum of "
        f"chunk r (Σ);\n{_steps(n - 1, 'all-gather')} the sums round. Each rank sends "
        f"{2 * (n - 1)} chunks of 1/{n} of the tensor"))

    def x_of(rank: int, chunk: int) -> float:
        return lead + rank * col + chunk * (cw + gap)

    def y_of(row: int) -> float:
        return height - 0.9 - row * (rh + rg) - rh

    for r in range(n):
        d.text(x_of(r, 0) + (n * cw + (n - 1) * gap) / 2, height - 0.3, f"rank {r}",
               colour=rank_colour(r), bold=True)
        for c in range(n):
            d.text(x_of(r, c) + cw / 2, height - 0.65, f"c{c}", colour=GREY, fontsize=7)
    for row, step in enumerate(steps):
        y = y_of(row)
        name = "start" if step.phase == "start" else f"{step.phase} {step.step}"
        d.text(0.1, y + rh / 2, name, align="left", fontsize=8)
        changed = {(dst, c) for _, dst, c in step.sends}
        for src, dst, _ in step.sends:
            if dst < src:  # the ring closes: say where rank 0's new chunk came from
                d.text(x_of(0, 0) - 0.08, y + rh + 0.12, f"from rank {src}",
                       colour=rank_colour(src), fontsize=7, align="right")
        for r in range(n):
            for c in range(n):
                who = step.holds[r][c]
                full = len(who) == n
                d.box(x_of(r, c), y, cw, rh, _label(who, n), colour=rank_colour(c),
                      alpha=0.25 + 0.75 * len(who) / n, fontsize=7 if n <= 4 else 6,
                      text_colour="white" if full else "#222222",
                      edge="#222222" if (r, c) in changed else GREY)
        if row + 1 < len(steps):
            for src, dst, c in steps[row + 1].sends:
                start = (x_of(src, c) + cw / 2, y)
                if dst > src:
                    d.arrow(start, (x_of(dst, c) + cw / 2, y - rg), colour=rank_colour(src))
                else:  # the ring closes: the last rank sends to rank 0
                    end = (x_of(src, n - 1) + cw + 0.3, y - rg / 2)
                    d.arrow(start, end, colour=rank_colour(src))
                    d.text(end[0] + 0.05, end[1], f"to rank {dst}", colour=rank_colour(src),
                           fontsize=7, align="left")
    d.text(width / 2, 0.2, "a+b: the sum of those ranks' chunks so far;  Σ: the sum over all "
           "ranks;  dark edge: the chunk just received", fontsize=8)
    return d
