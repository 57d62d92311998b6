"""Lesson 05: ``device_map="auto"`` written by hand, in two steps.

1. Budgets: ``"sequential"`` takes ``max_memory`` as given; ``"auto"``, ``"balanced"`` and
   ``"balanced_low_0"`` first lower the GPU budgets to spread the model over all the GPUs
   (:mod:`helpers.placement.strategies`).
2. The fill: walk the modules in order, sized from parameters and buffers; put each on the
   current device (GPU 0, GPU 1, ..., CPU, disk) if it fits, else replace it by its children,
   unless its class is unsplittable (a transformer block: its residual must stay on one
   device), in which case the walk moves on to the next device, for good.

Budgets are as accelerate writes them ("10GiB", "500MB", an int of bytes); the result is the
map module name -> device that ``accelerate.dispatch_model`` takes, as transformers plans it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from helpers.core.errors import DoesNotFitError
from helpers.core.sizes import format_bytes
from helpers.placement.sizing import Device, module_sizes, parse_budgets
from helpers.placement.strategies import balanced_budgets, validate_strategy

Entry = tuple[str, nn.Module | torch.Tensor]


def parts_of(module: nn.Module, prefix: str = "") -> list[Entry]:
    """What a module is made of, in order: its own parameters, its children, its own buffers."""

    def full(name: str) -> str:
        return f"{prefix}.{name}" if prefix else name

    return (
        [(full(n), p) for n, p in module.named_parameters(recurse=False)]
        + [(full(n), m) for n, m in module.named_children()]
        + [(full(n), b) for n, b in module.named_buffers(recurse=False)]
    )


def can_split(obj: nn.Module | torch.Tensor, no_split: Iterable[str]) -> bool:
    """True for a module with children whose class is not marked unsplittable."""
    return (
        isinstance(obj, nn.Module)
        and any(True for _ in obj.children())
        and type(obj).__name__ not in no_split
    )


def largest_layer(entries: list[Entry], sizes: Mapping[str, int], no_split: Iterable[str]) -> int:
    """Bytes of the largest *layer* (a leaf, or an unsplittable module) among ``entries``."""
    largest, todo = 0, list(entries)
    while todo:
        name, obj = todo.pop()
        if can_split(obj, no_split):
            todo.extend(parts_of(obj, name))
        else:
            largest = max(largest, sizes[name])
    return largest


@dataclass
class Plan:
    """A placement: ``device_map`` (module name -> device, in walk order) and its bookkeeping.

    ``budgets``: what the fill used (balanced), ``max_memory``: as given; ``used``: bytes placed.
    ``reserved``: room held back on a main device at the walk's last decision there.
    """

    device_map: dict[str, Device]
    budgets: dict[Device, int]
    sizes: dict[str, int]
    used: dict[Device, int] = field(default_factory=dict)
    reserved: dict[Device, int] = field(default_factory=dict)
    max_memory: dict[Device, int] = field(default_factory=dict)
    strategy: str = "sequential"

    def on(self, device: Device) -> list[str]:
        """Names of the modules placed on ``device``."""
        return [name for name, d in self.device_map.items() if d == device]


def plan_device_map(
    model: nn.Module,
    max_memory: Mapping[Device, int | str],
    *,
    strategy: str = "auto",
    no_split: Iterable[str] | None = None,
    dtype: torch.dtype | None = None,
    reserve_largest_layer: bool = True,
) -> Plan:
    """Place ``model``'s modules on the devices of ``max_memory``, as ``device_map=strategy`` does.

    ``strategy``: "sequential" fills the devices in order under ``max_memory``; "auto" (the
    same as "balanced") and "balanced_low_0" first balance the GPU budgets, then fill.
    ``no_split``: class names never cut in two (default: the model's ``_no_split_modules``).
    ``dtype``: plan as if the floating-point weights were loaded in this dtype.
    ``reserve_largest_layer``: accelerate's rule (on by default, as in accelerate). An
    offloaded layer runs on the first GPU (the CPU when there is none), and one read from
    disk passes through CPU memory, so on these *main* devices it holds back room for the
    largest layer still to place. Only the devices in ``max_memory`` are used: add
    ``"disk"`` to let the rest spill there.
    """

    validate_strategy(strategy)
    if no_split is None:
        no_split = getattr(model, "_no_split_modules", None) or []
    no_split = set(no_split)
    asked = parse_budgets(max_memory)
    budgets = dict(asked)  # step 1: the budgets ("sequential": max_memory as given)
    if strategy != "sequential":
        low_zero = strategy == "balanced_low_0"
        budgets = balanced_budgets(model, asked, low_zero=low_zero, no_split=no_split, dtype=dtype)
    sizes = module_sizes(model, dtype)
    devices = list(budgets)
    main = {devices[0], "cpu"} if isinstance(devices[0], int) else {"cpu"}
    plan = Plan({}, budgets, sizes, dict.fromkeys(devices, 0), max_memory=asked, strategy=strategy)

    todo, d = parts_of(model), 0  # step 2: the fill
    while todo:
        name, obj = todo.pop(0)
        while d < len(devices):
            device = devices[d]
            room = budgets[device] - plan.used[device]
            if reserve_largest_layer and device in main:
                plan.reserved[device] = largest_layer(todo, sizes, no_split)
                room -= plan.reserved[device]
            if sizes[name] <= room:  # it fits: place it here
                plan.device_map[name] = device
                plan.used[device] += sizes[name]
                break
            if can_split(obj, no_split):  # too big: try its children instead
                todo[:0] = parts_of(obj, name)
                break
            d += 1  # cannot split: this device is done, move on to the next
        else:
            balanced = "" if budgets == asked else f" (balanced by {strategy!r}: {budgets})"
            raise DoesNotFitError(
                f"{name!r} ({type(obj).__name__}, {format_bytes(sizes[name])}) fits on none of "
                f"the devices left in max_memory = {dict(max_memory)!r}{balanced}; valid: "
                "budgets that leave room for it on some device, or add (or enlarge) 'disk' to "
                "take the rest"
            )
    return plan


def device_of(name: str, device_map: Mapping[str, Device]) -> Device:
    """Device of tensor ``name`` in ``device_map``: the entry for its longest enclosing module."""
    parts = name.split(".")
    for i in range(len(parts), -1, -1):
        prefix = ".".join(parts[:i])
        if prefix in device_map:
            return device_map[prefix]
    raise KeyError(f"{name!r} is in no module of the device map (keys: {list(device_map)})")


def tensor_devices(model: nn.Module, device_map: Mapping[str, Device]) -> dict[str, Device]:
    """Device of every parameter and buffer of ``model`` under ``device_map``."""
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    return {n: device_of(n, device_map) for n in names}


def map_differences(
    model: nn.Module, a: Mapping[str, Device], b: Mapping[str, Device]
) -> list[tuple[str, Device, Device]]:
    """(tensor, device in a, device in b) for every tensor the two maps place differently."""
    in_a, in_b = tensor_devices(model, a), tensor_devices(model, b)
    return [(n, in_a[n], in_b[n]) for n in in_a if in_a[n] != in_b[n]]
