"""The pictures of this technique, drawn from the objects the lesson runs.

A schedule is an order of work per rank: forwards (F), backwards (B, or I then W when a
zero-bubble schedule splits them) of each micro-batch on each chunk. ``schedule_order`` is
the order PyTorch's schedule runs, ``ideal_timeline`` replays an order at ideal costs with
free sends (the tick diagram), and ``most_held`` counts the activations a rank holds at
once. The diagrams draw those replays, so every box is an action the schedule runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

from torch import nn

from helpers.core.drawing import GREY, INK, Diagram, rank_colour
from helpers.pipeline.events import COMPUTE, bubble_theory
from helpers.pipeline.runtime import CHUNKS_PER_RANK, SCHEDULES, rank_chunks

COST = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}  # ticks of one stage: a forward is 1
NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "interleaved 1F1B",
         "zero_bubble": "zero bubble"}
_TORCH_KINDS = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I",
                "BACKWARD_WEIGHT": "W"}


def _action(rank: int, kind: str, stage: int, microbatch: int, position: int) -> dict:
    """An action as ``events.Action.as_dict`` gives it, timed by its position in the order."""
    return {"rank": rank, "kind": kind, "stage": stage, "microbatch": microbatch,
            "start_ns": position, "end_ns": position + 1, "live_bytes": 0}


def warmup_order(stages: int, microbatches: int, warmup: Sequence[int]) -> list[dict]:
    """One chunk per rank: stage k runs ``warmup[k]`` forwards, then alternates one backward
    and one forward, then runs the backwards left, as PyTorch's ``Schedule1F1B`` does with
    warmup[k] = min(M, K - k) and ``ScheduleGPipe`` with warmup[k] = M."""
    if len(warmup) != stages or any(not 0 <= w <= microbatches for w in warmup):
        raise ValueError(f"warmup={list(warmup)!r}; valid: {stages} counts of forwards, "
                         f"each from 0 to M={microbatches}")
    out = []
    for k, w in enumerate(warmup):
        kinds = ["F"] * w
        for _ in range(microbatches - w):
            kinds += ["B", "F"]
        kinds += ["B"] * w
        count = {"F": 0, "B": 0}
        for position, kind in enumerate(kinds):
            out.append(_action(k, kind, k, count[kind], position))
            count[kind] += 1
    return out


def schedule_order(schedule: str, stages: int, microbatches: int) -> list[dict]:
    """Every compute action of one step of ``schedule``, in the order each rank runs it.

    GPipe and 1F1B: the order of their ``_step_microbatches`` (``warmup_order``). The
    interleaved schedules run the ``pipeline_order`` their class computes; it is read from
    the class, built on stand-ins of this rank's stages (it needs only their indices).
    """
    fewest = 1 if schedule == "gpipe" else stages  # Schedule1F1B refuses M < K
    if schedule not in SCHEDULES or stages < 2 or microbatches < fewest:
        raise ValueError(f"schedule={schedule!r}, stages={stages!r}, microbatches="
                         f"{microbatches!r}; valid: one of {list(SCHEDULES)}, stages >= 2, "
                         "microbatches >= 1 (GPipe), >= stages (the others)")
    if schedule in ("gpipe", "1f1b"):
        first = [microbatches if schedule == "gpipe" else stages - k for k in range(stages)]
        return warmup_order(stages, microbatches, first)
    total = CHUNKS_PER_RANK[schedule] * stages
    stand_ins = [SimpleNamespace(num_stages=total, group_size=stages, group_rank=0,
                                 stage_index=i, is_first=i == 0, is_last=i == total - 1,
                                 submod=nn.Identity()) for i in rank_chunks(schedule, 0, stages)]
    planned = SCHEDULES[schedule](stand_ins, microbatches, loss_fn=nn.MSELoss()).pipeline_order
    return [_action(rank, _TORCH_KINDS[a.computation_type.name], a.stage_index,
                    a.microbatch_index, position)
            for rank, actions in planned.items()
            for position, a in enumerate(a for a in actions if a is not None)]


def sequence(actions: Sequence[dict], rank: int) -> list[str]:
    """``rank``'s compute actions in the order it ran them, as ``F0.1`` (kind, chunk, micro-batch)."""
    mine = sorted((a for a in actions if a["rank"] == rank and a["kind"] in COMPUTE),
                  key=lambda a: a["start_ns"])
    return [f"{a['kind']}{a['stage']}.{a['microbatch']}" for a in mine]


def _ready(kind: str, stage: int, mb: int, done: dict, last_stage: int) -> float | None:
    """When the action's input exists (None: not yet)."""
    if kind == "F":
        return 0.0 if stage == 0 else done.get(("F", stage - 1, mb))
    if kind in ("B", "I"):
        if stage == last_stage:
            return done.get(("F", stage, mb))
        return done.get(("B", stage + 1, mb), done.get(("I", stage + 1, mb)))
    return done.get(("I", stage, mb))  # W after its own I


def ideal_timeline(actions: Sequence[dict], ranks: int, chunks_per_rank: int, *,
                   measured_costs: bool = False) -> list[dict]:
    """The order of each rank, replayed with free communication: the tick diagram.

    Costs are ``COST`` ticks divided by the chunks per rank, or with ``measured_costs``
    each action's own measured duration (ms). Returns the actions with float
    ``start``/``end``; an order in which a rank waits for its own later action (a
    backward before its forward) raises ValueError.
    """
    order = {r: sorted((a for a in actions if a["rank"] == r and a["kind"] in COMPUTE),
                       key=lambda a: a["start_ns"]) for r in range(ranks)}
    last_stage = max(a["stage"] for a in actions if a["kind"] in COMPUTE)
    free, position, done, out = [0.0] * ranks, [0] * ranks, {}, []
    while any(position[r] < len(order[r]) for r in range(ranks)):
        progressed = False
        for r in range(ranks):
            while position[r] < len(order[r]):
                a = order[r][position[r]]
                ready = _ready(a["kind"], a["stage"], a["microbatch"], done, last_stage)
                if ready is None:
                    break
                start = max(free[r], ready)
                cost = ((a["end_ns"] - a["start_ns"]) / 1e6 if measured_costs
                        else COST[a["kind"]] / chunks_per_rank)
                done[(a["kind"], a["stage"], a["microbatch"])] = end = start + cost
                out.append({**a, "start": start, "end": end})
                free[r], position[r], progressed = end, position[r] + 1, True
        if not progressed:
            stuck = [f"rank {r}: {sequence(order[r], r)[position[r]]}" for r in range(ranks)
                     if position[r] < len(order[r])]
            raise ValueError(f"cannot run this order: {'; '.join(stuck)} waits on an action "
                             "that comes later (a cycle)")
    return out


def most_held(actions: Sequence[dict], ranks: int, chunks_per_rank: int) -> list[float]:
    """Per rank, the most micro-batches whose activations it holds at once, in whole stages:
    a forward keeps a chunk's activations until its backward (B, or W after an I) frees them."""
    most = []
    for rank in range(ranks):
        held = peak = 0
        for step in sequence(actions, rank):
            held += {"F": 1, "B": -1, "W": -1}.get(step[0], 0)
            peak = max(peak, held)
        most.append(peak / chunks_per_rank)
    return most


def idle_share(replay: Sequence[dict], ranks: int) -> float:
    """The replay's idle share of device time: its bubble."""
    span = max(a["end"] for a in replay)
    return 1 - sum(a["end"] - a["start"] for a in replay) / (span * ranks)


def _on(rank: int) -> str:
    """Text colour on a box of ``rank``'s colour."""
    return "white" if rank % 8 in (0, 2, 5, 7) else INK


def _timeline(d: Diagram, replay: Sequence[dict], ranks: int, x0: float, y0: float,
              tick: float, span: float, *, row: float = 0.7, names: bool = True) -> None:
    """``replay`` as rows of boxes from (x0, y0) upwards, rank 0 on top; idle gaps dashed."""
    for r in range(ranks):
        y = y0 + (ranks - 1 - r) * row
        d.text(x0 - 0.1, y + 0.27, f"stage {r}" if names else f"rank {r}", align="right",
               fontsize=8)
        mine = sorted((a for a in replay if a["rank"] == r), key=lambda a: a["start"])
        edges = [0.0] + [t for a in mine for t in (a["start"], a["end"])] + [span]
        for start, end in zip(edges[::2], edges[1::2], strict=True):
            if end - start > 1e-9:
                d.box(x0 + start * tick, y, (end - start) * tick, 0.55,
                      "idle" if (end - start) * tick > 0.45 else "", colour="white", edge=GREY,
                      text_colour=GREY, fontsize=7, dashed=True)
        for a in mine:
            solid = a["kind"] == "F"
            label = f"{a['kind']}{a['microbatch']}" if names else str(a["microbatch"])
            d.box(x0 + a["start"] * tick, y, (a["end"] - a["start"]) * tick, 0.55, label,
                  colour=rank_colour(r), text_colour=_on(r) if solid else INK,
                  alpha=1.0 if solid else 0.45, dashed=a["kind"] == "W", fontsize=7)


def pipeline_diagram(stages: int, microbatches: int) -> Diagram:
    """Lesson 03's opening: micro-batches flowing through the stages, and GPipe's order of
    work on each stage replayed at ideal costs, its idle time (the bubble) dashed."""
    if stages < 2 or microbatches < 1:
        raise ValueError(f"stages={stages!r}, microbatches={microbatches!r}; valid: "
                         "stages >= 2 (a pipeline), microbatches >= 1")
    order = schedule_order("gpipe", stages, microbatches)
    replay = ideal_timeline(order, stages, 1)
    span, bubble = max(a["end"] for a in replay), idle_share(replay, stages)
    width, x0 = 11.0, 1.3
    tick, rows = (width - 0.2 - x0) / span, 0.7 * stages
    top = 1.0 + rows + 0.45  # the flow above the timeline
    d = Diagram(width, top + 1.5, f"Cut into M={microbatches} micro-batches, {stages} stages "
                f"work at the same time;\neach still idles {bubble:.0%} of the step while the "
                "pipeline fills and drains: the bubble")
    shown = min(microbatches, 6)
    for i in range(shown):  # the queue of micro-batches, the first one nearest stage 0
        d.box(0.2 + (shown - 1 - i) * 0.42, top + 0.45, 0.36, 0.5, f"{i}", fontsize=8)
    d.text(0.2 + shown * 0.21, top + 1.2, f"{microbatches} micro-batches", fontsize=8)
    x, step = 3.0, (width - 1.4 - 3.0) / stages
    d.arrow((0.2 + shown * 0.42, top + 0.7), (x, top + 0.7))
    for k in range(stages):
        d.box(x + k * step, top + 0.3, step - 0.9, 0.8, f"stage {k}\nrank {k}",
              colour=rank_colour(k), text_colour=_on(k))
        end = x + (k + 1) * step - 0.9
        to = x + (k + 1) * step if k < stages - 1 else width - 1.2
        d.arrow((end, top + 0.85), (to, top + 0.85), "activations" if k == 0 else "",
                fontsize=7)
        d.arrow((to, top + 0.5), (end, top + 0.5), "gradients" if k == 0 else "", dashed=True,
                fontsize=7)
    d.box(width - 1.2, top + 0.4, 1.0, 0.6, "loss")
    d.text(x0, 1.0 + rows + 0.1, "GPipe's order on each stage: every forward, then every "
           "backward", align="left", fontsize=8)
    _timeline(d, replay, stages, x0, 1.0, tick, span)
    d.arrow((x0, 0.75), (width - 0.2, 0.75), "time: a forward F takes 1 tick, a backward B 2",
            colour=GREY)
    k, m = stages, microbatches
    d.text(width / 2, 0.3, f"bubble = (K-1)/(M+K-1) = {k - 1}/{m + k - 1} = "
           f"{bubble_theory('gpipe', k, m):.0%} of each stage's time: the dashed boxes",
           fontsize=9, bold=True)
    return d


def schedules_diagram(schedules: Sequence[str], stages: int, microbatches: int) -> Diagram:
    """Each schedule's order replayed at ideal costs, one panel each, with the most
    micro-batches each rank holds activations for at once (in whole stages)."""
    if not schedules or len(set(schedules)) != len(schedules):
        raise ValueError(f"schedules={list(schedules)!r}; valid: distinct names of "
                         f"{list(SCHEDULES)}")
    panels = []
    for name in schedules:
        order, v = schedule_order(name, stages, microbatches), CHUNKS_PER_RANK.get(name, 1)
        replay = ideal_timeline(order, stages, v)
        panels.append((name, replay, most_held(order, stages, v), idle_share(replay, stages)))
    span = max(a["end"] for _, replay, _, _ in panels for a in replay)
    width, x0, x1, row = 11.0, 1.0, 8.7, 0.65
    height = len(panels) * (stages * row + 0.55) + 0.55
    held = {name: h for name, _, h, _ in panels}
    idle = {name: i for name, _, _, i in panels}
    title = "Activations each rank holds at most, per schedule, and the idle share"
    if {"gpipe", "1f1b"} <= set(held):
        title = (f"Same bubble, fewer activations: GPipe holds all {microbatches} micro-batches "
                 f"at once, 1F1B at most {max(held['1f1b']):g}")
    if "interleaved_1f1b" in held:
        title += (f"\ninterleaving idles {idle['interleaved_1f1b']:.0%} instead of "
                  f"{bubble_theory('gpipe', stages, microbatches):.0%}, holding up to "
                  f"{max(held['interleaved_1f1b']):g}")
    d = Diagram(width, height, title)
    y = height - 0.2
    for name, replay, most, share in panels:
        y -= 0.4
        d.text(x0, y + 0.12, f"{NAMES[name]}: idle {share:.0%} of the step", align="left",
               bold=True)
        d.text(width - 0.1, y + 0.12, "holds at most", align="right", fontsize=8)
        y -= stages * row
        _timeline(d, replay, stages, x0, y + 0.05, (x1 - x0) / span, span, row=row,
                  names=False)
        for r in range(stages):
            d.text(width - 0.1, y + 0.32 + (stages - 1 - r) * row,
                   f"{most[r]:g} micro-batch{'es' if most[r] != 1 else ''}", align="right",
                   fontsize=8)
        y -= 0.15
    weights = any(name == "zero_bubble" for name, *_ in panels)
    d.text(width / 2, 0.2, "dark: a forward; light: a backward"
           + (" (dashed edge: a weight gradient)" if weights else "")
           + "; dashed white: idle; numbers: micro-batches; time in ticks, a forward 1",
           fontsize=8, colour=GREY)
    return d


def chunks_diagram(schedules: Sequence[str], ranks: int) -> Diagram:
    """Where each schedule puts the model's chunks (``rank_chunks``), and the cuts between
    consecutive chunks that a micro-batch crosses between ranks, each way."""
    if ranks < 2 or any(name not in SCHEDULES for name in schedules) or not schedules:
        raise ValueError(f"schedules={list(schedules)!r}, ranks={ranks!r}; valid: names of "
                         f"{list(SCHEDULES)}, ranks >= 2")
    owner = {name: {c: r for r in range(ranks) for c in rank_chunks(name, r, ranks)}
             for name in schedules}
    crossings = {name: sum(o[c] != o[c + 1] for c in range(len(o) - 1))
                 for name, o in owner.items()}
    most = max(len(o) for o in owner.values())
    width, gap = 11.0, 0.45
    w = (width - 3.6 - (most - 1) * gap) / most
    few, many = min(crossings.values()), max(crossings.values())
    title = (f"A micro-batch's activation crosses between ranks {many} times forward, its "
             f"gradient {many} times back" if few == many else "Interleaving cuts the model "
             f"into more chunks: a micro-batch's activation crosses\nbetween ranks {many} "
             f"times forward instead of {few}, and its gradient {many} times back")
    d = Diagram(width, 1.2 * len(schedules) + 0.2, title)
    for i, name in enumerate(schedules):
        y = 1.2 * (len(schedules) - 1 - i) + 0.3
        d.text(0.1, y + 0.35, NAMES[name], align="left", bold=True, fontsize=9)
        for c, r in sorted(owner[name].items()):
            x = 2.1 + c * (w + gap)
            d.box(x, y, w, 0.7, f"chunk {c}\nrank {r}", colour=rank_colour(r),
                  text_colour=_on(r), fontsize=8)
            if c + 1 in owner[name]:
                d.arrow((x + w, y + 0.35), (x + w + gap, y + 0.35))
        d.text(width - 0.1, y + 0.35, f"{crossings[name]} crossing"
               f"{'s' if crossings[name] != 1 else ''}", align="right", fontsize=9)
    return d
