"""Sizes and budgets for placement: bytes of tensors and modules, ``max_memory`` parsed.

Budgets are written as accelerate writes them ("10GiB", "500MB", or an int of bytes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import nn

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
