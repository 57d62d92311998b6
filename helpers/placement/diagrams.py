"""The pictures of lesson 05, drawn from the planner's own ``Plan`` objects.

- ``device_map_diagram``: what each device holds under a plan, its budget and the room held
  back, the path of the activation at run time, and the weights copied in every forward.
- ``reserve_diagram``: why the fill holds back room for the largest layer: an offloaded
  layer is copied to the main device for its turn, beside what lives there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from torch import nn

from helpers.core.drawing import GREY, LIGHT, Diagram, rank_colour
from helpers.core.sizes import format_bytes
from helpers.placement.planner import Entry, Plan, can_split, parts_of
from helpers.placement.sizing import Device

RED = "#D55E00"
OFF_GPU = ("cpu", "disk")


def device_name(device: Device) -> str:
    """'GPU 0', 'CPU', 'disk'."""
    return f"GPU {device}" if isinstance(device, int) else {"cpu": "CPU"}.get(device, device)


def _colour(device: Device) -> str:
    return rank_colour(device) if isinstance(device, int) else {"cpu": GREY}.get(device, LIGHT)


def main_device(plan: Plan) -> Device:
    """Where offloaded layers run: the first GPU of the plan, else the CPU (as accelerate)."""
    gpus = [d for d in plan.budgets if isinstance(d, int)]
    return gpus[0] if gpus else "cpu"


def execution_path(plan: Plan) -> list[Device]:
    """The devices the activation visits in one forward, in the model's order.

    A layer on a GPU runs there; a layer in CPU memory or on disk runs on the main device.
    Consecutive layers on one device are one visit.
    """
    if not plan.device_map:
        raise ValueError("the plan places no module; valid: a plan from plan_device_map")
    main = main_device(plan)
    path: list[Device] = []
    for device in plan.device_map.values():
        runs_on = main if device in OFF_GPU else device
        if not path or path[-1] != runs_on:
            path.append(runs_on)
    return path


def _runs(plan: Plan) -> list[tuple[Device, list[str]]]:
    """Consecutive entries of the device map that share a device, in walk order."""
    runs: list[tuple[Device, list[str]]] = []
    for name, device in plan.device_map.items():
        if device not in plan.budgets:
            raise ValueError(f"the plan puts {name!r} on {device!r}, which has no budget; "
                             f"valid devices: {list(plan.budgets)}")
        if runs and runs[-1][0] == device:
            runs[-1][1].append(name)
        else:
            runs.append((device, [name]))
    return runs


def run_label(names: list[str]) -> str:
    """``blocks.0``, ``blocks.1``, ``blocks.2`` -> ``blocks.0–2``; other names listed."""
    parts: list[str] = []
    for name in names:
        found = re.fullmatch(r"(.*)\.(\d+)", name)
        last = re.fullmatch(r"(.*)\.(\d+)(?:–(\d+))?", parts[-1]) if parts else None
        if found and last and last.group(1) == found.group(1) and \
                int(last.group(3) or last.group(2)) + 1 == int(found.group(2)):
            parts[-1] = f"{last.group(1)}.{last.group(2)}–{found.group(2)}"
        else:
            parts.append(name)
    return "\n".join(parts) if len(parts) <= 3 else f"{parts[0]}\n...\n{parts[-1]}"


def _default_title(plans: Mapping[str, Plan]) -> str:
    """What the rows show: how many GPUs each plan uses, and what travels at run time."""
    said = []
    for label, plan in plans.items():
        gpus = [d for d in plan.budgets if isinstance(d, int)]
        used = sum(bool(plan.on(d)) for d in gpus)
        said.append(f"{label} puts layers on {used} of {len(gpus)} GPUs" if gpus else
                    f"{label}: every layer runs on the CPU")
    moved = any(plan.on(d) for plan in plans.values() for d in OFF_GPU if d != main_device(plan))
    return "; ".join(said) + ("\noffloaded weights are copied in for every forward, and one "
                              "device works at a time" if moved else
                              "\nthe activation visits one device at a time")


SIMULATED = " (simulated GPUs: planning only)"


def device_map_diagram(plans: Mapping[str, Plan], *, title: str = "",
                       simulated: bool = False) -> Diagram:
    """One row per plan: each device's budget (the box), the layers it holds, the room held
    back (dashed), the activation's hops at run time (arrows above) and the weights copied
    to the main device every forward (dashed arrows below). ``simulated``: say in the title
    that the GPUs are hypothetical."""
    if not plans:
        raise ValueError("no plans to draw; valid: a dict of label -> Plan")
    rows = {label: _runs(plan) for label, plan in plans.items()}
    sources = max(sum(bool(p.on(d)) for d in OFF_GPU if d != main_device(p)) for p in plans.values())
    extra = 0.4 * max(sources - 1, 0)  # room below the boxes for one copy arrow per source
    width, gap, tall, row = 10.4, 0.25, 1.7, 3.6 + extra
    finite = [b for p in plans.values() for d, b in p.budgets.items() if d != "disk"]
    held = [p.used.get(d, 0) + p.reserved.get(d, 0) for p in plans.values() for d in p.budgets]
    scale = tall / max([*finite, *held, 1])
    if not title:
        title = _default_title(plans)
    title += SIMULATED if simulated else ""
    d = Diagram(width, row * len(plans), title)
    for r, (label, plan) in enumerate(plans.items()):
        top = row * (len(plans) - r)
        base = top - row + 1.1 + extra
        devices = list(plan.budgets)
        col = min(1.9, (width - 0.2 - gap * (len(devices) - 1)) / len(devices))
        x_of = {dev: 0.1 + i * (col + gap) for i, dev in enumerate(devices)}
        d.text(0.1, top - 0.2, label, align="left", bold=True)
        for dev in devices:
            budget = plan.budgets[dev]
            height = min(tall, budget * scale)  # the disk's is cut
            d.box(x_of[dev], base, col, height, colour="white", edge=GREY, dashed=dev == "disk")
            limit = format_bytes(budget) + ("" if budget * scale <= tall * 1.001 else ", not to scale")
            d.text(x_of[dev] + col / 2, base - 0.2, device_name(dev), bold=True)
            d.text(x_of[dev] + col / 2, base - 0.45, f"budget {limit}", fontsize=7.5, colour=GREY)
            if not plan.on(dev) and not plan.reserved.get(dev):
                d.text(x_of[dev] + col / 2, base + 0.25, "nothing", fontsize=8, colour=GREY)
        stacked = dict.fromkeys(devices, 0.0)
        for dev, names in rows[label]:
            size = sum(plan.sizes[n] for n in names)
            h = max(size * scale, 0.22 * (run_label(names).count("\n") + 1))
            text = "white" if isinstance(dev, int) or dev == "cpu" else "black"
            d.box(x_of[dev] + 0.08, base + stacked[dev], col - 0.16, h, run_label(names),
                  colour=_colour(dev), text_colour=text, fontsize=7.5)
            stacked[dev] += h
        for dev, reserve in plan.reserved.items():
            if reserve:
                d.box(x_of[dev] + 0.08, base + stacked[dev], col - 0.16, reserve * scale,
                      f"held back\n{format_bytes(reserve)}", colour="white", edge=GREY,
                      text_colour=GREY, dashed=True, fontsize=7)
        path, arrow_y = execution_path(plan), base + tall + 0.15
        for i, (a, b) in enumerate(zip(path, path[1:], strict=False)):
            back = x_of[b] < x_of[a]  # back to the main device: arched lower, the other way
            d.arrow((x_of[a] + col * (0.4 if back else 0.6), arrow_y - (0.1 if back else 0)),
                    (x_of[b] + col * (0.6 if back else 0.4), arrow_y - (0.1 if back else 0)),
                    "activation" if i == 0 else "", bend=0.15 if back else -0.25)
        main = main_device(plan)
        moved = [dev for dev in OFF_GPU if dev != main and plan.on(dev)]
        for k, dev in enumerate(moved):
            y = base - 0.7 - 0.4 * k
            d.arrow((x_of[dev] + col / 2, y), (x_of[main] + col / 2, y), colour=RED, dashed=True)
            d.text((x_of[dev] + x_of[main] + col) / 2, y - 0.2,
                   f"weights copied to {device_name(main)}, every forward", colour=RED, fontsize=7.5)
    return d


def _entry_objects(model: nn.Module) -> dict[str, nn.Module | object]:
    return {**dict(model.named_modules()), **dict(model.named_parameters()),
            **dict(model.named_buffers())}


def offloaded_layers(model: nn.Module, plan: Plan,
                     no_split: Iterable[str] | None = None) -> dict[str, int]:
    """Bytes of every *layer* (a leaf, or an unsplittable module) the plan keeps in CPU memory
    or on disk, away from the main device, where it runs: name -> bytes, in walk order."""
    if no_split is None:
        no_split = getattr(model, "_no_split_modules", None) or []
    no_split = set(no_split)
    objects, main, found = _entry_objects(model), main_device(plan), {}
    for name, device in plan.device_map.items():
        if device not in OFF_GPU or device == main:
            continue
        if name not in objects:
            raise ValueError(f"the plan names {name!r}, which is not in the model; valid: "
                             "a plan of this model")
        todo: list[Entry] = [(name, objects[name])]
        while todo:
            part, obj = todo.pop(0)
            if can_split(obj, no_split):
                todo[:0] = parts_of(obj, part)
            else:
                found[part] = plan.sizes[part]
    return found


def peak_on_main(model: nn.Module, plan: Plan) -> tuple[int, str, int]:
    """(bytes the main device holds at worst, the layer copied in then, its bytes): what lives
    there, plus the largest offloaded layer, brought in whole for its turn."""
    layers = offloaded_layers(model, plan)
    if not layers:
        raise ValueError(f"the plan offloads nothing (devices used: "
                         f"{sorted(map(str, set(plan.device_map.values())))}); valid: a plan that "
                         "puts a layer in CPU memory or on disk")
    name = max(layers, key=layers.get)
    return plan.used.get(main_device(plan), 0) + layers[name], name, layers[name]


def reserve_diagram(model: nn.Module, plans: Mapping[str, Plan], *,
                    simulated: bool = False) -> Diagram:
    """Per plan, the main device at its fullest: the layers living there, the room held back,
    and the largest offloaded layer copied in for its turn, red where it overflows the budget.
    ``simulated``: say in the title that the GPUs are hypothetical."""
    if not plans:
        raise ValueError("no plans to draw; valid: a dict of label -> Plan")
    peaks = {label: peak_on_main(model, plan) for label, plan in plans.items()}
    mains = {label: main_device(plan) for label, plan in plans.items()}
    over = [label for label, plan in plans.items()
            if peaks[label][0] > plan.budgets[mains[label]]]
    scale = 2.6 / max(max(p[0], plan.budgets[mains[k]]) for k, (plan, p) in
                      ((k, (plans[k], peaks[k])) for k in plans))
    first = next(iter(plans))
    name = peaks[over[0] if over else first][1]
    title = (f"Held-back room is where an offloaded layer runs: without it, copying in "
             f"{name!r}\noverflows {device_name(mains[over[0]])}'s budget" if over else
             f"Every plan leaves room on its main device to copy in {name!r}")
    title += SIMULATED if simulated else ""
    panel, width = 5.0, 5.0 * len(plans)
    d = Diagram(width, 4.0, title)
    for i, (label, plan) in enumerate(plans.items()):
        x, base, main = i * panel + 1.2, 0.7, mains[label]
        peak, layer, size = peaks[label]
        budget = plan.budgets[main]
        d.text(i * panel + panel / 2, 3.8, label, bold=True)
        d.box(x, base, 1.6, budget * scale, colour="white", edge="black")
        d.text(x - 0.08, base + budget * scale, f"budget\n{format_bytes(budget)}",
               align="right", fontsize=7.5)
        d.text(x + 0.8, base - 0.25, device_name(main), bold=True)
        y = base
        for dev, names in _runs(plan):
            if dev == main:
                h = sum(plan.sizes[n] for n in names) * scale
                d.box(x + 0.1, y, 1.4, h, run_label(names), colour=_colour(main),
                      text_colour="white", fontsize=7.5)
                y += h
        reserve = plan.reserved.get(main, 0)
        fits = peak <= budget
        if reserve:
            d.box(x + 0.1, y, 1.4, reserve * scale, "", colour="white", edge=GREY, dashed=True)
        into = "\ninto the room\nheld back" if reserve >= size else ""
        d.box(x + 0.1, y, 1.4, size * scale, f"{layer}\ncopied in{into}", colour="white",
              edge=RED if not fits else "black", text_colour=RED if not fits else "black",
              dashed=True, fontsize=7.5)
        home = plan.device_map.get(layer) or next(
            dev for n, dev in plan.device_map.items() if layer.startswith(f"{n}."))
        d.box(x + 2.3, base, 1.3, 0.5, f"{layer}\non {device_name(home)}",
              colour=_colour(home), text_colour="black", fontsize=7.5)
        d.arrow((x + 2.3, base + 0.5), (x + 1.5, y + size * scale / 2), colour=RED, dashed=True)
        verdict = (f"fits: peak {format_bytes(peak)}" if fits else
                   f"over by {format_bytes(peak - budget)}")
        d.text(x + 0.8, base - 0.5, verdict, colour="black" if fits else RED, fontsize=8)
    return d
