"""The pictures of the tensor-parallel FFN, drawn from the shard plan the lessons run.

``ffn_split_diagram`` (lesson 07) draws what each rank holds of ``fc1`` and ``fc2`` (the
slices ``shard_rows`` gives it), its partial output and the one all-reduce that sums
them; ``torchrun_shards_diagram`` (lesson 08) draws the processes ``torchrun`` starts,
each loading the two files its rank's ``Split.file`` names. Both read the model's
``splits()``, so the pictures cannot drift from what the ranks load.
"""

from __future__ import annotations

from helpers.core.drawing import Diagram, rank_colour
from helpers.tensor_parallel.block import ParallelBlock
from helpers.tensor_parallel.ffn import shard_rows, validate_split

MAX_RANKS = 8  # more rows than this no longer fit a readable picture


def _plan(block: ParallelBlock, world_size: int) -> tuple[int, int, int]:
    """(hidden, ffn, ffn per rank), after checking that the picture can be drawn."""
    sizes = block.sizes()
    hidden, ffn = sizes["hidden_size"], sizes["ffn_size"]
    per = validate_split(ffn, world_size)
    if world_size > MAX_RANKS:
        raise ValueError(f"world_size={world_size}: the picture has room for 1 to "
                         f"{MAX_RANKS} ranks")
    return hidden, ffn, per


def _span(rows: slice) -> str:
    return f"{rows.start}–{rows.stop - 1}"


def ffn_split_diagram(block: ParallelBlock, world_size: int) -> Diagram:
    """Lesson 07's picture: per rank, its rows of fc1 and columns of fc2 (with their index
    ranges), its partial output, and the all-reduce that sums the partials."""
    hidden, ffn, per = _plan(block, world_size)
    tensors = {s.dim: s.tensor for s in block.splits()}  # 0: column-, 1: row-parallel
    row_h, gap, top = 0.8, 0.25, 1.0
    height = world_size * (row_h + gap) - gap + top + 0.2
    d = Diagram(12.0, height, "Each rank holds 1/p of fc1's rows and fc2's columns and works "
                "alone;\none all-reduce (a sum) turns the partial outputs into the output")
    y_low = 0.2
    y_high = y_low + world_size * (row_h + gap) - gap
    heads = ((1.35, "input"), (3.15, "fc1\ncolumn-parallel"), (4.95, "fc1's output"),
             (6.75, "fc2\nrow-parallel"), (8.5, "partial output"), (9.85, "g"),
             (11.15, "output"))
    for x, label in heads:
        d.text(x, y_high + 0.3, label, fontsize=8.5, bold=True)
    d.text(4.95, y_high + 0.75, "no communication between fc1 and fc2", fontsize=8)
    d.box(0.75, y_low, 1.2, y_high - y_low, f"x\n[tokens × {hidden}]\nwhole on\nevery rank",
          fontsize=8)
    d.box(9.4, y_low, 0.9, y_high - y_low, "all-\nreduce\n(sum)", fontsize=8)
    d.box(10.6, y_low, 1.1, y_high - y_low, f"y = sum of\nthe {world_size}\npartials\n"
          f"[tokens × {hidden}]\non every rank", fontsize=8)
    for rank in range(world_size):
        rows, colour = shard_rows(ffn, world_size, rank), rank_colour(rank)
        y = y_high - (rank + 1) * row_h - rank * gap
        mid = y + row_h / 2
        d.text(0.35, mid, f"rank {rank}", colour=colour, fontsize=8, bold=True)
        d.arrow((1.95, mid), (2.35, mid))
        d.box(2.35, y, 1.6, row_h, f"{tensors[0]}\nrows {_span(rows)}\n[{per} × {hidden}]",
              colour=colour, alpha=0.5, fontsize=7.5)
        d.arrow((3.95, mid), (4.35, mid))
        d.box(4.35, y, 1.2, row_h, f"units {_span(rows)}\nwhole", colour=colour, alpha=0.35,
              fontsize=7.5)
        d.arrow((5.55, mid), (5.95, mid))
        d.box(5.95, y, 1.6, row_h, f"{tensors[1]}\ncolumns {_span(rows)}\n[{hidden} × {per}]",
              colour=colour, alpha=0.5, fontsize=7.5)
        d.arrow((7.55, mid), (7.95, mid))
        d.box(7.95, y, 1.1, row_h, f"y{rank}\n[tokens × {hidden}]", colour=colour, alpha=0.35,
              fontsize=7.5)
        d.arrow((9.05, mid), (9.4, mid))
    d.arrow((10.3, (y_low + y_high) / 2), (10.6, (y_low + y_high) / 2))
    return d


def torchrun_shards_diagram(block: ParallelBlock, world_size: int) -> Diagram:
    """Lesson 08's picture: the processes torchrun starts, each loading its rank's shard
    files, and the one all-reduce per forward that gives every rank the output."""
    hidden, _, per = _plan(block, world_size)
    splits = block.splits()
    col_w, gap = 2.2, 0.3
    width = max(world_size * (col_w + gap) - gap + 0.4, 7.0)
    left = (width - (world_size * (col_w + gap) - gap)) / 2
    d = Diagram(width, 6.4, "torchrun starts one process per rank; each loads only its own "
                "shard files,\nand one all-reduce per forward gives every rank the output",
                scale=0.8)
    d.box(0.2, 5.6, width - 0.4, 0.6, f"torchrun --nproc-per-node={world_size}",
          fontsize=9)
    d.box(0.2, 0.2, width - 0.4, 0.7, "all-reduce (sum) of the partial outputs: "
          "once per forward, g", fontsize=9)
    for rank in range(world_size):
        x, colour = left + rank * (col_w + gap), rank_colour(rank)
        centre = x + col_w / 2
        d.arrow((centre, 5.6), (centre, 5.15))
        d.box(x, 1.45, col_w, 3.7, "", colour=colour, alpha=0.15)
        d.text(centre, 4.8, f"process {rank}\nRANK={rank}", colour=colour, fontsize=8,
               bold=True)
        for k, s in enumerate(splits):
            shape = f"[{per} × {hidden}]" if s.dim == 0 else f"[{hidden} × {per}]"
            d.box(x + 0.15, 3.75 - k * 0.8, col_w - 0.3, 0.65, f"{s.file(rank)}\n{shape}",
                  colour=colour, alpha=0.5, fontsize=8)
        d.box(x + 0.15, 1.6, col_w - 0.3, 0.7, f"partial y{rank}\n= shard(x)",
              colour="white", fontsize=8)
        d.arrow((centre, 2.95), (centre, 2.3))
        d.arrow((centre - 0.35, 1.6), (centre - 0.35, 0.9))
        d.arrow((centre + 0.35, 0.9), (centre + 0.35, 1.6), colour=colour)
        d.text(centre + 0.6, 1.25, "y", colour=colour, fontsize=8, bold=True)
    return d
