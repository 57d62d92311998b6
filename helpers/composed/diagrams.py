"""The pictures of this technique, drawn from the objects the lesson runs.

``mesh_diagram`` draws the ``(pp, dp, cp, tp)`` mesh's groups from :class:`Layout` (whose
``grid`` is the mesh ``train_3d`` builds); ``weight_diagram`` draws what one rank holds of
one weight, from the stage cut (:class:`StageModule`), the tensor-parallel plan
(``ledger.tp_dim``) and ``fully_shard``'s chunk of the first dimension.
"""

from __future__ import annotations

from fractions import Fraction

from helpers.composed.layout import DIMS, Layout, StageModule
from helpers.composed.ledger import tp_dim
from helpers.core.drawing import GREY, LIGHT, Diagram, rank_colour
from helpers.models.llama import build_lm

MAX_RANKS = 16  # more boxes than this in a row would not be readable


def _stride(layout: Layout, dim: str) -> int:
    """How far apart in the rank numbering two neighbours of a ``dim`` group are."""
    inner = DIMS[DIMS.index(dim) + 1:]
    return max(1, int(Layout(**{d: getattr(layout, d) for d in inner}).world_size))


def mesh_diagram(layout: Layout) -> Diagram:
    """The ranks of ``layout``'s mesh in their numbering, once per dimension (cp only when
    it is above 1), each box coloured by the group it belongs to along that dimension."""
    world = layout.world_size
    if not 1 < world <= MAX_RANKS:
        raise ValueError(f"a mesh of {world} ranks ({layout}); valid: 2 to {MAX_RANKS} ranks")
    rows = [dim for dim in ("tp", "cp", "dp", "pp") if dim != "cp" or layout.cp > 1]
    apart = {d: _stride(layout, d) for d in DIMS}
    said = {dim: ("neighbouring ranks" if apart[dim] == 1 else f"ranks {apart[dim]} apart")
            if getattr(layout, dim) > 1 else "one rank each" for dim in rows}
    inner = f"tp, the innermost dimension, groups {said['tp']};\n" + ", ".join(
        f"{dim} groups {said[dim]}" for dim in rows[1:])
    height = 0.7 + 1.2 * len(rows)
    d = Diagram(10.4, height, inner)
    step = 8.0 / world
    width, left, top = 0.82 * step, 2.3, height - 0.3
    shown = [dim for dim in DIMS if dim in rows]  # the coordinates, outermost first
    d.text(1.1, top, f"rank ({', '.join(shown)})", bold=True)
    for rank in range(world):
        c = layout.coords(rank)
        d.text(left + rank * step + width / 2, top, f"({', '.join(str(c[k]) for k in shown)})",
               fontsize=8)
    for row, dim in enumerate(rows):
        y = top - 0.35 - 1.2 * (row + 1) + 0.4
        groups = layout.groups(dim)
        d.text(1.1, y + 0.45, f"{dim} groups", bold=True)
        d.text(1.1, y + 0.1, "one rank each" if getattr(layout, dim) == 1
               else f"ranks {apart[dim]} apart", fontsize=8)
        for g, members in enumerate(groups):
            for rank in members:
                d.box(left + rank * step, y, width, 0.55, str(rank), colour=rank_colour(g),
                      alpha=0.55)
        d.text(left + world * step / 2, y - 0.22, "  ".join("{" + ", ".join(map(str, m)) + "}"
                                               for m in groups), fontsize=8)
    return d


def _held(config, rank: int, name: str) -> tuple[StageModule, list[int], int | None]:
    """The rank's stage, the weight's shape, and the dimension tp splits (None: whole)."""
    layout = config.layout
    stage = layout.coords(rank)["pp"]
    module = StageModule(build_lm(config.model, seed=config.seed), stage, layout.pp)
    shapes = {n: list(p.shape) for n, p in module.named_parameters() if p.dim() == 2}
    if name not in shapes:
        raise ValueError(f"name={name!r} is no 2-D weight of rank {rank}'s stage {stage}; "
                         f"valid: {', '.join(shapes)}")
    return module, shapes[name], tp_dim(name) if layout.tp > 1 else None


def _spans(size: int, parts: int, index: int) -> tuple[int, int]:
    """The [start, end) of piece ``index`` when ``size`` is cut in ``parts`` chunks of
    ``ceil(size / parts)`` (``fully_shard``'s chunking, and the plans' even split)."""
    chunk = -(-size // parts)
    return min(size, index * chunk), min(size, (index + 1) * chunk)


def weight_diagram(config, rank: int, name: str) -> Diagram:
    """What ``rank`` holds of weight ``name`` under ``config.layout``: only its stage's
    blocks, of each weight its tensor-parallel slice, of that slice its ``fully_shard``
    chunk of the first dimension (rows)."""
    layout = config.layout
    module, (rows, cols), split = _held(config, rank, name)
    c = layout.coords(rank)
    # the slice tp gives this rank, then fully_shard's chunk of its rows
    r0, r1, k0, k1 = 0, rows, 0, cols
    if split == 0:
        r0, r1 = _spans(rows, layout.tp, c["tp"])
    elif split == 1:
        k0, k1 = _spans(cols, layout.tp, c["tp"])
    tr0, tr1 = (r0, r1) if split == 0 else (k0, k1)
    a, b = _spans(r1 - r0, layout.dp, c["dp"])
    r0, r1 = r0 + a, r0 + b
    held = Fraction((r1 - r0) * (k1 - k0), rows * cols)
    blocks = config.model.blocks
    mine = [int(k) for k in module.blocks]
    how = ("tp slices the weight, FSDP (dp) shards the slice" if split is not None
           else "tp keeps this weight whole, FSDP (dp) shards it")
    d = Diagram(10.4, 4.8, f"Rank {rank} holds {held} of this weight, and only its stage's "
                           f"blocks:\n{how}")
    colour = rank_colour(rank)
    # the model, cut by pp: its stage coloured
    parts = ["embed", *(f"block {k}" for k in range(blocks)), "norm + head"]
    h = min(0.55, 3.6 / len(parts))
    d.text(1.3, 4.45, f"pp: stage {c['pp']} of {layout.pp}", bold=True)
    for k, part in enumerate(parts):
        prefixes = {"embed": ("embed.",), "norm + head": ("norm.", "head.")}.get(
            part, (f"blocks.{part.split()[-1]}.",))
        ours = any(n.startswith(prefixes) for n, _ in module.named_parameters())
        y = 4.0 - (k + 1) * (h + 0.05)
        d.box(0.4, y, 1.8, h, part, colour=colour if ours else LIGHT, alpha=0.6 if ours else 1,
              dashed=not ours, text_colour="#222222" if ours else GREY, fontsize=8)
        if name.startswith(prefixes):
            source = (2.25, y + h / 2)
    # the weight: its tensor-parallel slices, each cut in dp chunks of rows
    scale = min(3.6 / cols, 3.0 / rows)
    x0, y0, w, hh = 3.4, 3.9 - rows * scale, cols * scale, rows * scale
    d.arrow(source, (x0 - 0.1, y0 + hh / 2), colour=GREY)
    d.text(x0 + w / 2, 4.2, f"{name}: {rows} x {cols}", fontsize=8, bold=True)
    for t in range(layout.tp if split is not None else 1):
        tr = _spans(rows, layout.tp, t) if split == 0 else (0, rows)
        tk = _spans(cols, layout.tp, t) if split == 1 else (0, cols)
        for s in range(layout.dp):
            a, b = _spans(tr[1] - tr[0], layout.dp, s)
            ours = (t == c["tp"] or split is None) and s == c["dp"]
            d.box(x0 + tk[0] * scale, y0 + hh - (tr[0] + b) * scale, (tk[1] - tk[0]) * scale,
                  (b - a) * scale, f"tp {t}, dp {s}" if split is not None else f"dp {s}",
                  colour=colour if ours else LIGHT, alpha=0.6 if ours else 1, fontsize=7)
    d.text(x0 + w / 2, y0 - 0.25, f"{cols} columns; {rows} rows, first row on top", fontsize=8)
    # in words
    lines = [f"rank {rank} = (pp {c['pp']}, dp {c['dp']}, tp {c['tp']})",
             f"pp: blocks {mine[0]}-{mine[-1]} of {blocks}",
             "tp: the whole weight" if split is None else
             f"tp: {'rows' if split == 0 else 'columns'} {tr0}-{tr1 - 1}, slice "
             f"{c['tp'] + 1} of {layout.tp}",
             f"dp: rows {r0}-{r1 - 1}, chunk {c['dp'] + 1} of {layout.dp}",
             f"holds {r1 - r0} x {k1 - k0} = {(r1 - r0) * (k1 - k0):,} elements"]
    for k, line in enumerate(lines):
        d.text(7.45, 3.9 - 0.55 * k, line, align="left", fontsize=8.5)
    return d
