"""The pictures of context parallelism, drawn from the plans the ranks run.

``causal_work_diagram`` colours each (query chunk, key chunk) piece by the rank that
computes it, as :meth:`helpers.context_parallel.ring.RingPlan.pieces` plans it, for the
contiguous and the zig-zag split; ``ring_attention_diagram`` draws which key/value block
each rank holds at each step of the ring (``RingPlan.owner``), greying the steps a causal
rank skips; ``ulysses_diagram`` draws the all-to-all from sequence-split to head-split.
"""

from __future__ import annotations

from helpers.context_parallel.ring import RingPlan
from helpers.context_parallel.split import causal_work, positions
from helpers.core.drawing import GREY, LIGHT, Diagram, rank_colour

MAX_CP = 4  # the most ranks a diagram draws legibly


def _check_cp(cp: object) -> int:
    if isinstance(cp, bool) or not isinstance(cp, int) or not 2 <= cp <= MAX_CP:
        raise ValueError(f"cp={cp!r}; valid: an integer from 2 to {MAX_CP}")
    return cp


def _grid(d: Diagram, x0: float, cp: int, split: str, side: float) -> None:
    """One split's (query chunk x key chunk) grid: computed pieces in their rank's colour."""
    seq = 4 * cp * 2  # any multiple of 2 cp: pieces are drawn by chunk
    parts = cp if split == "contiguous" else 2 * cp
    size, cell = seq // parts, side / parts
    owner_of_chunk = {}
    for rank in range(cp):
        for start in positions(rank, cp, seq, split)[::size].tolist():
            owner_of_chunk[start // size] = rank
    computed = set()
    for rank in range(cp):
        plan = RingPlan(rank, cp, seq, split, causal=True)
        mine = positions(rank, cp, seq, split)
        for step in range(cp):
            theirs = positions(plan.owner(step), cp, seq, split)
            for qs, ks, _ in plan.pieces(step):
                computed.add((int(mine[qs.start]) // size, int(theirs[ks.start]) // size))
    for qc in range(parts):
        for kc in range(parts):
            y = 0.6 + (parts - 1 - qc) * cell
            done = (qc, kc) in computed
            d.box(x0 + kc * cell, y, cell * 0.96, cell * 0.96,
                  colour=rank_colour(owner_of_chunk[qc]) if done else LIGHT, edge=GREY)
        d.text(x0 - 0.15, 0.6 + (parts - 1 - qc + 0.5) * cell, f"q{qc}", fontsize=7,
               align="right")
    for kc in range(parts):
        d.text(x0 + (kc + 0.5) * cell, 0.4, f"k{kc}", fontsize=7)
    work = [causal_work(r, cp, seq, split) // size**2 for r in range(cp)]
    d.text(x0 + side / 2, 0.6 + side + 0.3, f"{split}: pieces per rank {work}", fontsize=9)


def causal_work_diagram(cp: int = 4) -> Diagram:
    """Causal attention's pieces, coloured by the rank that computes them, for both splits."""
    _check_cp(cp)
    side = 3.2
    contiguous = [causal_work(r, cp, 8 * cp, "contiguous") for r in range(cp)]
    title = (f"Under a causal mask, contiguous rank {cp - 1} computes {contiguous[-1] // contiguous[0]}x "
             "rank 0's share;\nthe zig-zag split gives every rank the same")
    d = Diagram(2 * side + 2.6, side + 1.4, title)
    _grid(d, 0.8, cp, "contiguous", side)
    _grid(d, side + 2.2, cp, "zigzag", side)
    for rank in range(cp):
        d.box(side + 0.95, 0.8 + rank * 0.45, 0.3, 0.3, colour=rank_colour(rank))
        d.text(side + 1.35, 0.95 + rank * 0.45, f"rank {rank}", fontsize=8, align="left")
    return d


def ring_attention_diagram(cp: int = 4, causal: bool = True) -> Diagram:
    """Which key/value block each rank attends at each step; skipped steps greyed."""
    _check_cp(cp)
    seq = 8 * cp
    cell_w, cell_h = 1.6, 0.55
    plans = [RingPlan(rank, cp, seq, "contiguous", causal) for rank in range(cp)]
    skipped = sum(not plan.pieces(step) for plan in plans for step in range(cp))
    saving = (f"causal: {skipped} of {cp * cp} rank-steps have nothing to compute" if causal
              else "without a mask every rank-step computes")
    d = Diagram(cp * cell_w + 1.6, cp * cell_h + 1.3,
                f"Ring attention: queries stay, keys and values move one rank a step;\n{saving}")
    for rank, plan in enumerate(plans):
        x = 1.3 + rank * cell_w
        d.text(x + cell_w / 2 - 0.05, cp * cell_h + 0.95, f"rank {rank}: Q{rank}", fontsize=8,
               colour=rank_colour(rank), bold=True)
        for step in range(cp):
            owner = plan.owner(step)
            y = 0.4 + (cp - 1 - step) * cell_h
            done = bool(plan.pieces(step))
            d.box(x, y, cell_w - 0.15, cell_h - 0.1, f"KV{owner}" + ("" if done else " skip"),
                  colour=rank_colour(owner) if done else LIGHT, alpha=1.0 if done else 0.6,
                  text_colour="white" if done else GREY, fontsize=8)
            if step < cp - 1 and rank < cp - 1:
                d.arrow((x + cell_w - 0.2, y + 0.1), (x + cell_w + 0.05, y - cell_h + 0.35),
                        colour=GREY)
    for step in range(cp):
        d.text(0.1, 0.4 + (cp - 1 - step) * cell_h + cell_h / 2 - 0.05, f"step {step}",
               fontsize=8, align="left")
    return d


def ulysses_diagram(cp: int = 2, heads: int = 4) -> Diagram:
    """Ulysses' all-to-all: each rank's tokens of every head -> every token of its heads."""
    _check_cp(cp)
    if heads % cp:
        raise ValueError(f"heads={heads!r} must be divisible by cp={cp}")
    per = heads // cp
    cw, ch = 0.55, 0.4
    width = 2 * heads * cw + 3.6
    d = Diagram(width, cp * ch * 2 + 1.6,
                f"Ulysses: one all-to-all turns {cp} slices of the sequence into {cp} groups "
                f"of {per} heads;\neach rank then attends whole sequences")
    for side, x0 in (("before", 0.6), ("after", heads * cw + 2.6)):
        d.text(x0 + heads * cw / 2, cp * ch * 2 + 0.8,
               "sequence-split (b, h, s/cp, d)" if side == "before" else "head-split (b, h/cp, s, d)",
               fontsize=8)
        for chunk in range(cp):
            for head in range(heads):
                holder = chunk if side == "before" else head // per
                y = 0.4 + (cp - 1 - chunk) * ch * 2
                d.box(x0 + head * cw, y, cw * 0.92, ch * 1.8, f"h{head}\ns{chunk}",
                      colour=rank_colour(holder), text_colour="white", fontsize=6)
    d.arrow((heads * cw + 0.8, cp * ch), (heads * cw + 2.4, cp * ch), "all-to-all")
    return d
