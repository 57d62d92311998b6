"""The pictures of this technique, drawn from the objects the lesson runs.

``megatron_block_diagram`` draws one Llama block split over ``tp`` ranks as
:func:`~helpers.tensor_parallel.transformer_block.split_weights` deals it: each rank's
query and key/value heads (``head_ranges``), its rows and columns of every matrix, the
norms whole, f before each half and g after it. ``sequence_parallel_diagram`` draws what
``parallelize_module``'s sequence-parallel plan (``plans.llama_plans``) does to the
shape of the activations: ``(b, s/tp, h)`` around the norms, every token and a width
split by ``tp`` inside attention and the MLP (drawn as the queries' ``(b, s, h/tp)``), an
all-gather on the way in and a reduce-scatter on the way out.
"""

from __future__ import annotations

from helpers.core.drawing import GREY, LIGHT, Diagram, rank_colour
from helpers.models.llama import Block
from helpers.tensor_parallel.attention_shards import head_ranges
from helpers.tensor_parallel.sequence import SEQ_DIM, check_sequence_split
from helpers.tensor_parallel.transformer_block import split_weights

MAX_RANKS = 4  # more lanes than this do not fit the canvas legibly
F_COLOUR, G_COLOUR = "#FFF2B3", "#FFD6CC"


def _check_ranks(tp: object) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int) or not 2 <= tp <= MAX_RANKS:
        raise ValueError(f"tp={tp!r}; valid: an integer from 2 to {MAX_RANKS}")
    return tp


def _half(d: Diagram, y0: float, height: float, tp: int, norm: str, lanes: list,
          entry: str, exit_: str) -> None:
    """One half of the block in a band from ``y0``: norm, f, the ranks' lanes, g, +."""
    mid = y0 + height / 2 - 0.15
    d.text(0.3, mid, entry, fontsize=11, bold=True)
    d.arrow((0.45, mid), (0.8, mid))
    d.box(0.8, mid - 0.35, 1.3, 0.7, f"{norm}\nwhole", fontsize=8)
    d.box(2.5, mid - 0.3, 0.6, 0.6, "f", colour=F_COLOUR, fontsize=12)
    d.arrow((2.1, mid), (2.5, mid))
    lane_h = min(0.95, (height - 0.8) / tp - 0.12)
    top = mid + (tp * (lane_h + 0.12) - 0.12) / 2
    for rank, draw in enumerate(lanes):
        y = top - (rank + 1) * lane_h - rank * 0.12
        d.box(3.5, y, 4.6, lane_h, colour=rank_colour(rank), alpha=0.22)
        d.arrow((3.1, mid), (3.5, y + lane_h / 2))
        d.arrow((8.1, y + lane_h / 2), (8.5, mid))
        draw(y, lane_h)
    d.box(8.5, mid - 0.3, 0.6, 0.6, "g", colour=G_COLOUR, fontsize=12)
    d.arrow((9.1, mid), (9.5, mid))
    d.box(9.5, mid - 0.25, 0.5, 0.5, "+", fontsize=11)
    d.arrow((10.0, mid), (10.45, mid))
    d.text(10.65, mid, exit_, fontsize=11, bold=True)
    ceiling = y0 + height - 0.2  # the residual path, over the lanes
    d.ax.plot([0.62, 0.62, 9.75], [mid, ceiling, ceiling], color=GREY, linestyle="--", lw=1)
    d.arrow((9.75, ceiling), (9.75, mid + 0.25), colour=GREY, dashed=True)
    d.text(5.8, ceiling + 0.12, f"residual: {entry}, whole on every rank", colour=GREY,
           fontsize=7)


def megatron_block_diagram(block: Block, tp: int) -> Diagram:
    """``block`` on ``tp`` ranks: each rank's heads and MLP columns, f and g around them."""
    _check_ranks(tp)
    cuts = [split_weights(block, rank, tp) for rank in range(tp)]  # refuses a tp that won't split
    attn = block.attn
    heads = [head_ranges(attn.heads, attn.kv_heads, tp, rank) for rank in range(tp)]
    band = max(2.7, tp * 1.07 + 0.8)
    d = Diagram(12, 2 * band + 0.9, f"One block on {tp} ranks: each rank owns its heads and its "
                f"MLP columns;\nf and g are the only places the ranks talk")

    def attention_lane(rank: int):
        q, kv = heads[rank]
        c = cuts[rank]

        def draw(y: float, h: float) -> None:
            d.text(3.6, y + h - 0.2, f"rank {rank}", align="left", fontsize=8, bold=True)
            size = min(0.34, h / 2 - 0.06)
            for k, head in enumerate([*(f"q{i}" for i in q), *(f"kv{i}" for i in kv)]):
                x = 4.35 + k * (size + 0.08) + (0.2 if head.startswith("kv") else 0.0)
                d.box(x, y + h - size - 0.04, size, size, head, colour=rank_colour(rank),
                      text_colour="white", fontsize=6)
            q_rows, o_cols = c["attn.q_proj.weight"], c["attn.o_proj.weight"]
            kv_rows = c["attn.k_proj.weight"]
            d.text(5.8, y + 0.18, f"q rows {q_rows.start}:{q_rows.stop} · k, v rows "
                   f"{kv_rows.start}:{kv_rows.stop} · o columns {o_cols.start}:{o_cols.stop}",
                   fontsize=7)
        return draw

    def mlp_lane(rank: int):
        up, down = cuts[rank]["mlp.up_proj.weight"], cuts[rank]["mlp.down_proj.weight"]

        def draw(y: float, h: float) -> None:
            d.text(3.6, y + h - 0.2, f"rank {rank}", align="left", fontsize=8, bold=True)
            width = 3.0 / up.size
            for r in range(tp):  # the MLP's width, this rank's share filled
                part = cuts[r]["mlp.up_proj.weight"]
                d.box(4.35 + part.start * width, y + h - 0.3, (part.stop - part.start) * width,
                      0.22, colour=rank_colour(rank) if r == rank else LIGHT)
            d.text(5.8, y + 0.18, f"gate, up rows {up.start}:{up.stop} · down columns "
                   f"{down.start}:{down.stop} of {up.size}", fontsize=7)
        return draw

    _half(d, band + 0.9, band, tp, "attn_norm", [attention_lane(r) for r in range(tp)],
          "x", "h")
    _half(d, 0.9, band, tp, "mlp_norm", [mlp_lane(r) for r in range(tp)], "h", "out")
    d.text(11.3, 2 * band + 0.4, "attention:\nsplit by\nheads", fontsize=8)
    d.text(11.3, band + 0.4, "MLP:\nsplit by\nits width", fontsize=8)
    d.box(0.8, 0.15, 0.4, 0.4, "f", colour=F_COLOUR, fontsize=9)
    d.text(1.35, 0.35, "identity forward, all-reduce of the gradient backward", align="left",
           fontsize=8)
    d.box(6.4, 0.15, 0.4, 0.4, "g", colour=G_COLOUR, fontsize=9)
    d.text(6.95, 0.35, "all-reduce (sum) forward, identity backward", align="left", fontsize=8)
    return d


def _style_names(plan: dict, style: str, **layouts: str) -> list[str]:
    """The plan's module names whose style is ``style`` and whose layouts read as given."""
    found = []
    for name, value in plan.items():
        if type(value).__name__ != style:
            continue
        if all(str(getattr(value, k, ())) == v for k, v in layouts.items()):
            found.append(name)
    return found


def sequence_parallel_diagram(plan: dict, batch: int, seq: int, hidden: int,
                              tp: int) -> Diagram:
    """What a block's sequence-parallel ``plan`` (``llama_plans(True)[1]``) does to the
    activations' shape on each of ``tp`` ranks, for ``batch`` x ``seq`` tokens of width
    ``hidden``."""
    _check_ranks(tp)
    check_sequence_split(seq, tp)
    if hidden % tp:
        raise ValueError(f"hidden={hidden} is not divisible by tp={tp}; valid: a multiple of {tp}")
    shard = f"(Shard(dim={SEQ_DIM}),)"
    norms = _style_names(plan, "SequenceParallel", sequence_sharding=shard)
    gathers = _style_names(plan, "PrepareModuleInput", input_layouts=shard,
                           desired_input_layouts="(Replicate(),)")
    columns = _style_names(plan, "ColwiseParallel")
    scatters = _style_names(plan, "RowwiseParallel", output_layouts=shard)
    if not (norms and gathers and columns and scatters):
        raise ValueError(f"the plan {sorted(plan)} is not sequence-parallel: it needs "
                         "SequenceParallel norms, a PrepareModuleInput all-gather and a "
                         "RowwiseParallel with output Shard(1); valid: llama_plans(True)[1]")
    short = lambda names: ", ".join(n.rpartition(".")[2].removesuffix("_proj") for n in names)  # noqa: E731
    lane = 1.25
    height = tp * lane + 2.3
    d = Diagram(12, height, "Sequence parallelism: between the regions each rank keeps its "
                "tokens, (b, s/tp, h);\nan all-gather and a reduce-scatter take the places "
                "of f and g")
    stages = [("rows", f"(b, s/tp, h)\n{(batch, seq // tp, hidden)}"),
              ("whole", f"(b, s, h)\n{(batch, seq, hidden)}"),
              ("columns", f"q: (b, s, h/tp)\n{(batch, seq, hidden // tp)}"),
              ("partial", f"(b, s, h) partial\nsums, {(batch, seq, hidden)}"),
              ("rows", f"(b, s/tp, h)\n{(batch, seq // tp, hidden)}")]
    steps = [("all-gather", f"{short(gathers)} inputs\n(replaces f)"),
             (short(columns), "ColwiseParallel"),
             (short(scatters), "RowwiseParallel"),
             ("reduce-scatter", f"{short(scatters)} outputs\n(replaces g)")]
    xs = [1.0 + 2.45 * k for k in range(len(stages))]
    top = height - 0.25
    d.text(xs[0] + 0.45, top, f"{short(norms)}:\nSequenceParallel", fontsize=8)
    d.text(xs[4] + 0.45, top, "residual, next\nnorm: the same", fontsize=8)
    d.text((xs[1] + xs[3]) / 2 + 0.45, top, "tensor-parallel region: attention\n(the MLP "
           "alike, its width split)", fontsize=8)
    size = 0.85
    for rank in range(tp):
        y = height - 0.8 - (rank + 1) * lane
        d.text(0.45, y + size / 2, f"rank {rank}", fontsize=8, bold=True)
        for x, (kind, _) in zip(xs, stages, strict=True):
            d.box(x, y, size, size, colour=LIGHT)
            part = {"rows": (x, y + size - (rank + 1) * size / tp, size, size / tp),
                    "columns": (x + rank * size / tp, y, size / tp, size)}.get(kind, (x, y, size,
                                                                                    size))
            d.box(*part, colour=rank_colour(rank), alpha=0.4 if kind == "partial" else 1.0,
                  dashed=kind == "partial")
        for k in range(len(steps)):
            d.arrow((xs[k] + size + 0.1, y + size / 2), (xs[k + 1] - 0.1, y + size / 2))
    for k, (step, under) in enumerate(steps):
        mid = (xs[k] + size + xs[k + 1]) / 2
        d.text(mid, height - 0.95, step, fontsize=8, bold=True)
        d.text(mid, 1.05, under, fontsize=7)
    for x, (_, label) in zip(xs, stages, strict=True):
        d.text(x + size / 2, 0.4, label, fontsize=7)
    d.text(0.45, 0.4, "tokens s ↓\nwidth h →", fontsize=7, colour=GREY)
    return d
