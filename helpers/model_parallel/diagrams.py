"""The pictures of lessons 01 and 02, drawn from the objects the lessons run.

- ``ways_to_cut_diagram``: the course map, three ways to cut a model's training.
- ``two_devices_diagram``: a model cut once, the activation going forward across the cut,
  its gradient coming back, and the idle timeline that follows.
- ``stages_diagram``: a ``StagedModel``'s stages and what each holds.
- ``naive_timeline``: when each stage works in one naive training step (what the timeline
  draws and what the exercises check).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from helpers.core.drawing import GREY, Diagram, rank_colour
from helpers.model_parallel.stages import StagedModel, stage_bytes


@dataclass(frozen=True)
class Way:
    """One way to cut a model's training: what is cut, its name, the lessons that teach it."""

    cut: str
    technique: str
    lessons: tuple[str, ...]


WAYS_TO_CUT = (
    Way("between layers", "model and pipeline parallelism", ("01", "02", "03", "04", "05")),
    Way("inside layers", "tensor and expert parallelism", ("07", "08", "09", "11")),
    Way("the data", "data and context parallelism", ("06", "10")),
)
DEBUGGING = "12"  # the lesson that sees inside a distributed run and debugs it
ALL_THREE = "13"  # the lesson that combines the three on one mesh


@dataclass(frozen=True)
class Busy:
    """One stretch of a step: ``stage`` runs ``phase`` (forward, backward or copy)."""

    stage: int
    phase: str
    start: float
    end: float


def naive_timeline(forward: Sequence[float], backward: Sequence[float],
                   copy: float = 0.0) -> list[Busy]:
    """One training step of K stages run one after another, in time order.

    Forward runs stage 0 to K-1, backward K-1 to 0; each crossing of a cut (the
    activation forward, its gradient back) takes ``copy`` and is charged to the receiver.
    """
    if not forward or len(forward) != len(backward):
        raise ValueError(f"got {len(forward)} forward and {len(backward)} backward times; "
                         "valid: one of each per stage, at least one stage")
    for name, values in (("forward", forward), ("backward", backward), ("copy", [copy])):
        if any(t < 0 for t in values):
            raise ValueError(f"{name} times {list(values)} include a negative one; valid: >= 0")
    events: list[Busy] = []
    clock = 0.0

    def run(stage: int, phase: str, length: float) -> None:
        nonlocal clock
        if phase != "copy" or length > 0:
            events.append(Busy(stage, phase, clock, clock + length))
        clock += length

    stages = len(forward)
    for k in range(stages):
        if k:
            run(k, "copy", copy)
        run(k, "forward", forward[k])
    for k in reversed(range(stages)):
        if k < stages - 1:
            run(k, "copy", copy)
        run(k, "backward", backward[k])
    return events


def busy_shares(events: Sequence[Busy]) -> list[float]:
    """Each stage's share of the step spent computing (copies left out)."""
    step = max(e.end for e in events)
    stages = max(e.stage for e in events) + 1
    return [sum(e.end - e.start for e in events if e.stage == k and e.phase != "copy") / step
            for k in range(stages)]


def _timeline(d: Diagram, events: Sequence[Busy], x0: float, y0: float, width: float,
              row: float, note: str = "time: one training step") -> None:
    """Draw ``events`` as one row per stage (stage 0 on top), idle gaps as dashed boxes."""
    stages = max(e.stage for e in events) + 1
    step = max(e.end for e in events)
    scale = width / step
    for k in range(stages):
        y = y0 + (stages - 1 - k) * row
        d.text(x0 - 0.1, y + row / 2, f"device {k}", align="right", fontsize=8)
        clock = 0.0
        for e in sorted((e for e in events if e.stage == k), key=lambda e: e.start):
            if e.start > clock:
                d.box(x0 + clock * scale, y + 0.08, (e.start - clock) * scale, row - 0.16,
                      "idle", colour="white", edge=GREY, text_colour=GREY, dashed=True,
                      fontsize=8)
            label = {"forward": "forward", "backward": "backward"}.get(e.phase, "")
            colour = rank_colour(k) if e.phase != "copy" else GREY
            d.box(x0 + e.start * scale, y + 0.08, (e.end - e.start) * scale, row - 0.16, label,
                  colour=colour, text_colour="white", fontsize=8)
            clock = e.end
        if clock < step:
            d.box(x0 + clock * scale, y + 0.08, (step - clock) * scale, row - 0.16, "idle",
                  colour="white", edge=GREY, text_colour=GREY, dashed=True, fontsize=8)
    d.arrow((x0, y0 - 0.1), (x0 + width, y0 - 0.1), colour=GREY)
    d.text(x0 + width / 2, y0 - 0.3, note, colour=GREY, fontsize=8)


def ways_to_cut_diagram(ways: Sequence[Way] = WAYS_TO_CUT) -> Diagram:
    """The course map: cut between layers, inside layers, or the data (the batch, or each
    sequence), and where each is taught."""
    if len(ways) != 3:
        raise ValueError(f"got {len(ways)} ways to cut; valid: the three of WAYS_TO_CUT")
    d = Diagram(12, 4.8, "Three ways to cut a model's training: between its layers, inside its "
                "layers, or its data")
    panel, w, gap, y, h = 3.6, 0.55, 0.15, 1.95, 1.9
    for i, way in enumerate(ways):
        x0 = 0.2 + i * (panel + 0.4)
        d.box(x0, 0.5, panel, 4.2, colour="white", edge=GREY)
        d.text(x0 + panel / 2, 4.35, f"cut {way.cut}", bold=True, fontsize=10)
        left = x0 + (panel - 5 * w - 5 * gap + 0.1) / 2
        halves = way.cut == "the data"
        for r in range(2 if halves else 1):  # the batch, whole or in halves
            rows = h / 2 if halves else h
            d.box(left, y + (1 - r) * rows if halves else y, w - 0.1, rows,
                  "½" if halves else "batch", colour=rank_colour(r) if halves else GREY,
                  text_colour="white", fontsize=7)
        for j in range(4):
            x = left + (j + 1) * (w + gap)
            if way.cut == "between layers":
                d.box(x, y, w, h, f"L{j + 1}", colour=rank_colour(j // 2), text_colour="white")
                continue
            for r in range(2):  # top: device 0, bottom: device 1
                label = f"½L{j + 1}" if way.cut == "inside layers" else f"L{j + 1}"
                d.box(x, y + (1 - r) * h / 2, w, h / 2, label, colour=rank_colour(r),
                      text_colour="white", fontsize=8)
        what = {"between layers": "device 0 holds L1, L2; device 1 holds L3, L4",
                "inside layers": "each device: half of every layer"}.get(
                    way.cut, "each device: every layer, half the data")
        d.text(x0 + panel / 2, 1.6, what, fontsize=8)
        d.text(x0 + panel / 2, 1.15, way.technique, fontsize=9)
        many = "lessons" if len(way.lessons) > 1 else "lesson"
        d.text(x0 + panel / 2, 0.8, f"{many} " + ", ".join(way.lessons), fontsize=9, bold=True)
    d.text(6, 0.2, f"colour: device 0 blue, device 1 orange.   Lesson {DEBUGGING} sees and debugs a "
           f"run; lesson {ALL_THREE} combines all three on one mesh of devices.",
           colour=GREY, fontsize=9)
    return d


@contextmanager
def _looking(model: nn.Module) -> Iterator[None]:
    """Run ``model`` to read shapes only: eval mode, no autograd, every module's mode kept."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for module, training in modes:
            module.training = training


def _names(model: nn.Module) -> dict[int, str]:
    return {id(m): name.rsplit(".", 1)[-1] for name, m in model.named_modules() if name}


def _cut_activation(layers: Sequence[nn.Module], model: nn.Module, point: int,
                    inputs: torch.Tensor) -> tuple[int, ...]:
    """The shape of what layer ``point - 1`` hands over at a cut, from a real forward."""
    seen: list[torch.Tensor] = []
    handle = layers[point - 1].register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        with _looking(model):
            model(inputs)
    finally:
        handle.remove()
    return tuple(seen[0].shape)


def two_devices_diagram(model: nn.Module, inputs: torch.Tensor) -> Diagram:
    """A model cut once (its ``layer_chain()``): the activation forward, its gradient back,
    and the naive timeline that follows, schematic: every forward and backward one unit long."""
    layers, points = model.layer_chain()
    if len(points) != 1:
        raise ValueError(f"the model is cut at {list(points)}; valid: exactly one cut, "
                         "two devices")
    names, shape = _names(model), _cut_activation(layers, model, points[0], inputs)
    stages = [layers[: points[0]], layers[points[0]:]]
    d = Diagram(10, 5.6, "Only one device works at a time: device 1 waits for the activation,"
                "\nthen device 0 waits for its gradient")
    for k, stage in enumerate(stages):
        x = 0.3 + k * 6.0
        params = sum(p.numel() for m in stage for p in m.parameters())
        d.box(x, 3.2, 3.4, 2.0, colour=rank_colour(k), alpha=0.25)
        d.text(x + 1.7, 4.85, f"device {k}", bold=True)
        d.text(x + 1.7, 4.3, ", ".join(names.get(id(m), type(m).__name__) for m in stage))
        d.text(x + 1.7, 3.7, f"{params:,} parameters", fontsize=8)
    d.arrow((3.75, 4.6), (6.25, 4.6), colour=rank_colour(0))
    d.text(5.0, 4.85, f"activation {shape}", colour=rank_colour(0), fontsize=8)
    d.arrow((6.25, 3.8), (3.75, 3.8), colour=rank_colour(1))
    d.text(5.0, 3.55, f"gradient {shape}", colour=rank_colour(1), fontsize=8)
    _timeline(d, naive_timeline([1.0, 1.0], [1.0, 1.0]), 1.4, 0.6, 8.3, 0.9,
              "time: one training step (schematic: each forward and backward drawn alike)")
    return d


def stages_diagram(model: StagedModel, inputs: torch.Tensor, name: str = "The model") -> Diagram:
    """Each stage of ``model``: its layers and its share of the weights; the activation
    (its shape from a real forward of ``inputs``) crosses each cut, its gradient comes back."""
    if not isinstance(model, StagedModel):
        raise TypeError(f"model is a {type(model).__name__}; valid: a StagedModel")
    names, sizes = _names(model), stage_bytes(model)
    heavy = max(range(len(sizes)), key=sizes.__getitem__)
    share = [s / sum(sizes) for s in sizes]
    stages = len(model.stages)
    d = Diagram(10, 4.2, f"{name} in {stages} stages: stage {heavy} holds {share[heavy]:.0%} of "
                "the weights;\nonly the activation crosses each cut, and its gradient comes back")
    gap = 2.4
    w = (9.6 - (stages - 1) * gap) / stages
    for k, stage in enumerate(model.stages):
        x = 0.2 + k * (w + gap)
        d.box(x, 1.5, w, 2.5, colour=rank_colour(k), alpha=0.25)
        d.text(x + w / 2, 3.7, f"stage {k}: device {k}", bold=True)
        chips = [names.get(id(m), type(m).__name__) for m in stage]
        per_row = 3
        for i, chip in enumerate(chips):
            cw = (w - 0.2) / per_row
            cx, cy = x + 0.1 + (i % per_row) * cw, 2.85 - (i // per_row) * 0.5
            d.box(cx + 0.03, cy, cw - 0.06, 0.4, chip, colour="white", fontsize=7)
        params = sum(p.numel() for p in stage.parameters())
        d.text(x + w / 2, 1.75, f"{params:,} parameters, {sizes[k] / 1e6:.1f} MB", fontsize=8)
    x = inputs
    for k in range(stages - 1):
        with _looking(model):
            x = model.stages[k](x.to(model.devices[k]))  # what crosses cut k
        shape = tuple(x.shape)
        left = 0.2 + (k + 1) * w + k * gap
        d.arrow((left + 0.05, 3.2), (left + gap - 0.05, 3.2), colour=rank_colour(k))
        d.text(left + gap / 2, 3.45, f"activation {shape}", colour=rank_colour(k), fontsize=7)
        d.arrow((left + gap - 0.05, 2.3), (left + 0.05, 2.3), colour=rank_colour(k + 1))
        d.text(left + gap / 2, 2.05, "its gradient", colour=rank_colour(k + 1), fontsize=7)
    d.text(0.2, 1.15, "share of the weights (parameters and buffers):", align="left", fontsize=8)
    x = 0.2
    for k, s in enumerate(share):
        d.box(x, 0.3, 9.6 * s, 0.6, f"{s:.0%}" if s > 0.04 else "", colour=rank_colour(k),
              text_colour="white", fontsize=8)
        x += 9.6 * s
    return d
