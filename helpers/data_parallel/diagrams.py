"""The pictures of this technique, drawn from the objects the lesson runs.

- ``data_parallel_diagram``: replicated weights, the batch split by ``rows_of`` (each
  rank's rows, as the lesson's ranks take them), the gradients averaged by an all-reduce.
- ``zero_holdings_diagram``: which slice of the weights, gradients and optimizer state
  each rank keeps under DDP and ZeRO-1/2/3, sized by the estimator that predicts the
  lesson's ledgers (``helpers.memory.parameters.sharded_parameter_memory``).
- ``zero3_diagram``: ZeRO-3's gather, compute, free per unit, drawn from the events a
  real ``HandZero`` stage-3 step records (``zero3_events``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from helpers.core.drawing import GREY, LIGHT, Diagram, rank_colour
from helpers.core.sizes import format_bytes
from helpers.data_parallel.fsdp import fsdp_units
from helpers.data_parallel.rank_step import rows_of
from helpers.data_parallel.zero import HandZero
from helpers.memory.measure import default_loss
from helpers.memory.parameters import sharded_parameter_memory
from helpers.torchrun.in_notebook import run_ranks

KINDS = (("weights", "weights"), ("grads", "gradients"), ("optimizer_state", "optimizer"))
STAGE_NAMES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")


def _ranks(world_size: object, most: int = 4) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) \
            or not 2 <= world_size <= most:
        raise ValueError(f"world_size={world_size!r}; valid: an integer from 2 to {most}")
    return world_size


def data_parallel_diagram(world_size: int = 2, batch: int = 4) -> Diagram:
    """Each rank: the whole model, its own rows of the batch; one all-reduce of gradients."""
    n = _ranks(world_size)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < n or batch % n:
        raise ValueError(f"batch={batch!r} does not split over {n} ranks; valid: a multiple "
                         f"of {n}, at most 16")
    if batch > 16:
        raise ValueError(f"batch={batch!r}; valid: a multiple of {n}, at most 16")
    width, height = 10.5, 6.3
    d = Diagram(width, height, "Data parallelism: every rank holds the whole model and runs "
                "its own rows of the batch;\nan all-reduce averages the gradients, so every "
                "copy takes the same step")
    rows = [rows_of(torch.arange(batch), r, n).tolist() for r in range(n)]
    owner = {s: r for r, mine in enumerate(rows) for s in mine}
    sw = min(0.7, 6.0 / batch)
    x0 = (width - batch * sw) / 2
    d.text(x0 - 0.15, 5.85, "one batch", align="right", fontsize=9)
    for s in range(batch):
        d.box(x0 + s * sw + 0.04, 5.6, sw - 0.08, 0.5, f"s{s}", colour=rank_colour(owner[s]),
              alpha=0.5)
    col = (width - 0.6) / n

    def mid(r: int) -> float:
        return 0.3 + (r + 0.5) * col

    bw = min(3.6, col - 0.4)
    for r in range(n):
        x, c = mid(r) - bw / 2, rank_colour(r)
        d.text(mid(r), 4.8, f"rank {r}", colour=c, bold=True)
        d.arrow((x0 + (rows[r][0] + len(rows[r]) / 2) * sw, 5.6), (mid(r), 5.0), colour=c)
        d.box(x, 3.95, bw, 0.6, "weights W: a whole copy", colour=LIGHT)
        d.box(x, 3.05, bw, 0.6, "forward + backward on samples "
              + ", ".join(map(str, rows[r])), colour=c, alpha=0.35)
        d.box(x, 2.15, bw, 0.6, f"gradient g{r} of its own rows", colour=c, alpha=0.6)
        d.arrow((mid(r), 2.15), (mid(r), 1.55), colour=c)
        d.box(x, 0.1, bw, 0.55, "W ← W − lr · ḡ: the same step", colour=LIGHT)
    mean = " + ".join(f"g{r}" for r in range(n))
    d.box(0.5, 0.95, width - 1.0, 0.6, f"all-reduce, then ÷ {n}:  ḡ = ({mean}) / {n}, "
          "on every rank", colour="#FFFFFF")
    for r in range(n):
        d.arrow((mid(r), 0.95), (mid(r), 0.65), colour=rank_colour(r))
    return d


def _holdings(numel: int, tensors: int, world_size: int) -> list[dict[str, int]]:
    """Bytes per kind one rank keeps, per stage, by the lesson's estimator (no unit whole)."""
    return [{kind: getattr(sharded_parameter_memory(numel, tensors, optimizer="adam",
                                                    dp=world_size, zero=stage), kind)
             for kind, _ in KINDS} for stage in range(len(STAGE_NAMES))]


def zero_holdings_diagram(model: nn.Module, world_size: int = 2) -> Diagram:
    """What each rank keeps of ``model``'s weights, gradients and Adam state, per stage."""
    n = _ranks(world_size)
    params = list(model.parameters())
    if not params:
        raise ValueError("the model has no parameters: nothing to shard")
    held = _holdings(sum(p.numel() for p in params), len(params), n)
    whole = held[0]
    width, lead, row_h, bar_h = 10.5, 2.3, 1.25, 0.26
    height = 0.9 + len(STAGE_NAMES) * row_h
    d = Diagram(width, height, "Each ZeRO stage shards one more kind over the ranks: the "
                "optimizer state (1),\nthen the gradients (2), then the weights (3). A rank "
                "keeps only its own slice of those")
    block, size_w = (width - lead - 0.1) / n, 0.85
    scale = (block - size_w - 0.2) / max(whole.values())
    for r in range(n):
        d.text(lead + (block - size_w) / 2 + r * block, height - 0.3, f"rank {r}",
               colour=rank_colour(r), bold=True)
    for stage, name in enumerate(STAGE_NAMES):
        top = height - 0.6 - stage * row_h
        d.text(0.1, top - 0.5, name, align="left", bold=True)
        for k, (kind, label) in enumerate(KINDS):
            y = top - 0.15 - (k + 1) * (bar_h + 0.08)
            d.text(lead - 0.1, y + bar_h / 2, label, align="right", fontsize=7)
            full = whole[kind] * scale
            sharded = held[stage][kind] < whole[kind]
            for r in range(n):
                x0 = lead + r * block
                if sharded:  # what DDP keeps, drawn dashed: the rest lives on the other ranks
                    d.box(x0, y, full, bar_h, colour="#FFFFFF", edge=GREY, dashed=True)
                    d.box(x0 + r * full / n, y, held[stage][kind] * scale, bar_h,
                          colour=rank_colour(r), edge=rank_colour(r))
                else:
                    for q in range(n):
                        d.box(x0 + q * full / n, y, full / n, bar_h, colour=rank_colour(q),
                              alpha=0.45, edge=GREY)
                d.text(x0 + full + 0.08, y + bar_h / 2, format_bytes(held[stage][kind]),
                       align="left", fontsize=7)
    d.text(width / 2, 0.2, "bytes: this model with Adam in float32, by the estimator, without the "
           "one unit held whole; dashed: held by the other ranks", fontsize=8)
    return d


def zero3_events(model: nn.Module, inputs: torch.Tensor,
                 labels: torch.Tensor) -> list[tuple[str, str]]:
    """(what, unit) in the order a ``HandZero`` stage-3 step does them, on one rank, with
    the lesson's units (``fsdp_units``: the embedding, each block, the norm with the head):
    "gather" (all-gather the unit's weights), "reduce-scatter" (its gradient) and "free".
    Run as one rank of a gloo group of one, as a thread of this process, on a copy of
    ``model`` (ZeRO-3 frees the weights it does not hold)."""
    events: list[tuple[str, str]] = []
    model = copy.deepcopy(model)

    def work(rank: int, group: object) -> None:
        zero = HandZero(model, fsdp_units(model), 3, lr=1e-3, group=group)
        gather, release, done = zero.gather, zero.release, zero._unit_backward_done

        def logged(what: str, call):
            def run(unit: str) -> None:
                events.append((what, unit))
                call(unit)
            return run

        zero.gather, zero.release = logged("gather", gather), logged("free", release)
        zero._unit_backward_done = logged("reduce-scatter", done)
        try:
            zero.step(inputs, labels, default_loss)
        finally:
            zero.remove()

    (outcome,) = run_ranks(1, work, timeout=30)
    if isinstance(outcome, BaseException):
        raise outcome
    return events


def _slots(events: Sequence[tuple[str, str]]) -> list[tuple[str, str, bool]]:
    """(unit, "forward" or "backward", reduce-scattered?) per gather-to-free span."""
    slots, open_unit, scattered, seen = [], None, False, set()
    for what, unit in events:
        if what == "gather" and open_unit is None:
            open_unit, scattered = unit, False
        elif what == "reduce-scatter" and unit == open_unit:
            scattered = True
        elif what == "free" and unit == open_unit:
            slots.append((unit, "backward" if unit in seen else "forward", scattered))
            seen.add(unit)
            open_unit = None
        else:
            raise ValueError(f"event {(what, unit)!r} out of order; valid: gather, then "
                             "(reduce-scatter), then free, of one unit at a time")
    if open_unit is not None:
        raise ValueError(f"unit {open_unit!r} was gathered and never freed")
    return slots


def zero3_diagram(events: Sequence[tuple[str, str]]) -> Diagram:
    """When each unit's weights are whole in a ZeRO-3 step (``zero3_events``): gather,
    compute, free. The units are drawn in the order they are first gathered."""
    slots = _slots(events)
    if not slots:
        raise ValueError("no events: nothing was gathered; valid: zero3_events(...)'s list")
    units = list(dict.fromkeys(unit for unit, _, _ in slots))
    lead, slot_w, row_h = 1.4, 0.58, 0.42
    width = lead + len(slots) * slot_w + 0.2
    height = 1.2 + len(units) * row_h + 0.5
    d = Diagram(width, height, "ZeRO-3 gathers a unit's weights just before it computes "
                "and frees them right after:\none unit is whole at a time; the rest stays "
                "sharded, 1/N per rank")
    forward = sum(kind == "forward" for _, kind, _ in slots)
    d.text(lead + forward * slot_w / 2, height - 0.35, "forward →", bold=True)
    d.text(lead + (forward + len(slots)) * slot_w / 2, height - 0.35, "← backward", bold=True)
    for i, unit in enumerate(units):
        y = height - 0.8 - (i + 1) * row_h
        d.text(lead - 0.1, y + row_h / 2, unit, align="right", fontsize=8)
        d.box(lead, y + row_h / 2 - 0.03, len(slots) * slot_w, 0.06, colour=LIGHT, edge=LIGHT)
    for k, (unit, kind, scattered) in enumerate(slots):
        y = height - 0.8 - (units.index(unit) + 1) * row_h + 0.04
        x, h, c = lead + k * slot_w + 0.02, row_h - 0.08, rank_colour(0)
        parts = [("G", 0.16, GREY), ("F" if kind == "forward" else "B", 0.38, c)]
        if scattered:
            parts = [("G", 0.15, GREY), ("B", 0.22, c), ("RS", 0.17, rank_colour(1))]
        for label, w, colour in parts:
            d.box(x, y, w, h, label, colour=colour, text_colour="white", fontsize=7)
            x += w
    d.text(width / 2, 0.3, "G: all-gather the unit's weights  ·  F, B: its forward, backward  "
           "·  RS: reduce-scatter its gradient  ·  after each: free them", fontsize=8)
    return d
