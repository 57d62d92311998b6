"""Lesson 04: ``device_map="auto"`` written by hand.

Fill the fastest device first, then the next one (GPU 0, GPU 1, ..., CPU, disk),
whole modules at a time, under a memory budget per device (``max_memory``):

- walk the model's modules in order and size each one from its parameters and
  buffers (bytes = elements x bytes per element of its dtype);
- a module that fits in what is left on the current device goes there;
- one that does not fit is replaced by its children, unless its class is marked
  unsplittable (a transformer block: its residual connection must stay on one device);
- a module that cannot be split moves the walk on to the next device, for good.

Budgets are written as accelerate writes them ("10GiB", "500MB", or an int of bytes),
and the result is the map module name -> device that ``accelerate.dispatch_model``
takes. ``reserve_largest_layer=True`` adds accelerate's one extra rule (see
:func:`plan_device_map`); with it, this planner and ``accelerate.infer_auto_device_map``
give the same placement on the lesson's models.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from helpers.core.errors import DoesNotFitError
from helpers.core.sizes import format_bytes

Device = int | str  # a GPU index, "cpu" or "disk", as accelerate's device maps write them

SIZE_FORMS = (
    "an int number of bytes (e.g. 1073741824), or a number and a unit: "
    "'KiB', 'MiB', 'GiB' (powers of 1024, e.g. '10GiB') or 'KB', 'MB', 'GB' "
    "(powers of 1000, e.g. '500MB', '10GB')"
)
DEVICE_FORMS = "GPU indices as ints (0, 1, ...), 'cpu' and 'disk'"
_UNITS = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMG]I?B)\s*", re.IGNORECASE)


def parse_size(size: int | str, *, what: str = "size") -> int:
    """Bytes in ``size``: an int, or a string such as ``"10GiB"``, ``"500MB"`` or ``"1.5GB"``.

    The forms and values are those of ``accelerate.utils.convert_file_size_to_int``, with
    one exception: accelerate reads a final lowercase ``b`` of a decimal unit as *bits*
    (``"10Gb"`` = 1.25e9 bytes). That is almost always a typo, so it is refused here.
    """
    if isinstance(size, int) and not isinstance(size, bool):
        if size < 0:
            raise ValueError(f"{what} = {size!r} is negative; valid forms: {SIZE_FORMS}")
        return size
    if not isinstance(size, str):
        raise ValueError(f"{what} = {size!r} is a {type(size).__name__}; valid forms: {SIZE_FORMS}")
    match = _SIZE.fullmatch(size)
    if match is None:
        hint = " (a string needs a unit)" if re.fullmatch(r"\s*[\d.]+\s*", size) else ""
        raise ValueError(f"{what} = {size!r} is not a size{hint}; valid forms: {SIZE_FORMS}")
    number, unit = match.groups()
    if unit.endswith("b") and "i" not in unit.lower():
        raise ValueError(
            f"{what} = {size!r} ends in a lowercase 'b', which accelerate reads as bits; "
            f"write '{number}{unit.upper()}' for bytes; valid forms: {SIZE_FORMS}"
        )
    return int(float(number) * _UNITS[unit.upper()])  # computed as accelerate computes it


def parse_budgets(max_memory: Mapping[Device, int | str]) -> dict[Device, int]:
    """``max_memory`` in bytes, ordered as the planner fills it: GPU 0, GPU 1, ..., cpu, disk."""
    if not max_memory:
        raise ValueError(f"max_memory is empty; give a budget for some of: {DEVICE_FORMS}")
    budgets: dict[Device, int] = {}
    for device, size in max_memory.items():
        gpu_index = isinstance(device, int) and not isinstance(device, bool) and device >= 0
        if not gpu_index and device not in ("cpu", "disk"):
            hint = ""
            if isinstance(device, str) and re.fullmatch(r"(cuda:)?\d+", device):
                hint = f" (write the GPU index as the int {int(device.split(':')[-1])})"
            raise ValueError(
                f"unknown device {device!r} in max_memory{hint}; valid: {DEVICE_FORMS}"
            )
        budgets[device] = parse_size(size, what=f"max_memory[{device!r}]")
    gpus = sorted(d for d in budgets if isinstance(d, int))
    return {d: budgets[d] for d in [*gpus, "cpu", "disk"] if d in budgets}


def tensor_bytes(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> int:
    """Bytes of ``tensor``; with ``dtype``, floating-point tensors count as loaded in that dtype.

    As accelerate does, a ``dtype`` never makes a tensor bigger, and integer tensors keep theirs.
    """
    size = tensor.element_size()
    if dtype is not None and (tensor.is_floating_point() or tensor.is_complex()):
        size = min(size, dtype.itemsize)
    return tensor.numel() * size


def module_sizes(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, int]:
    """Bytes of every module and tensor of ``model`` by name ("" is the whole model)."""
    sizes = {name: 0 for name, _ in model.named_modules()}  # modules without weights too
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        parts = name.split(".")
        for i in range(len(parts) + 1):
            prefix = ".".join(parts[:i])
            sizes[prefix] = sizes.get(prefix, 0) + tensor_bytes(tensor, dtype)
    return sizes


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

    ``used``: bytes placed per device. ``reserved``: room held back on a main device at the
    walk's last decision there (when it moved on, the room the next module could not have).
    """

    device_map: dict[str, Device]
    budgets: dict[Device, int]
    sizes: dict[str, int]
    used: dict[Device, int] = field(default_factory=dict)
    reserved: dict[Device, int] = field(default_factory=dict)

    def on(self, device: Device) -> list[str]:
        """Names of the modules placed on ``device``."""
        return [name for name, d in self.device_map.items() if d == device]


def plan_device_map(
    model: nn.Module,
    max_memory: Mapping[Device, int | str],
    *,
    no_split: Iterable[str] | None = None,
    dtype: torch.dtype | None = None,
    reserve_largest_layer: bool = False,
) -> Plan:
    """Place ``model``'s modules on the devices of ``max_memory``, fastest first.

    ``no_split``: class names never cut in two (default: the model's ``_no_split_modules``).
    ``dtype``: plan as if the floating-point weights were loaded in this dtype.
    ``reserve_largest_layer``: accelerate's rule. Offloaded layers are brought to the
    *main* devices (the first GPU, and the CPU) to run, so there it holds back room for
    the largest layer still to place. Only the devices in ``max_memory`` are used: add
    ``"disk"`` to let the rest spill there.
    """
    budgets = parse_budgets(max_memory)
    if no_split is None:
        no_split = getattr(model, "_no_split_modules", None) or []
    no_split = set(no_split)
    sizes = module_sizes(model, dtype)
    devices = list(budgets)
    main = {devices[0], "cpu"} if isinstance(devices[0], int) else {"cpu"}
    plan = Plan({}, budgets, sizes, used=dict.fromkeys(devices, 0))

    todo, d = parts_of(model), 0
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
            raise DoesNotFitError(
                f"{name!r} ({type(obj).__name__}, {format_bytes(sizes[name])}) fits on none of "
                f"the devices left in max_memory = {dict(max_memory)!r}; valid: budgets that leave "
                f"room for it on some device, or add (or enlarge) 'disk' to take the rest"
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
