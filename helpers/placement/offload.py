"""Lesson 05: run a model whose layers live on GPU, CPU and disk, with accelerate.

``accelerate.dispatch_model`` attaches a hook to every module: before the module runs,
its weights are brought to the execution device (from CPU memory, or read back from a
file of the offload folder), and after it runs they are dropped again. The offloaded
parameters themselves stay on the ``meta`` device: a shape and a dtype, no data.

``dispatch_model`` writes the offload folder itself when it finds no ``index.json``,
and reuses any folder that has one, even a half-written or stale one. So the folder is
written first as a verified folder (``helpers.core.files``): complete, checksummed,
renamed into place; reused only when its manifest matches the weights to offload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from helpers.core.files import (
    MANIFEST,
    folder_matches,
    remove_verified_folder,
    sha256_bytes,
    write_verified_folder,
)
from helpers.core.optional import quiet_logs, require
from helpers.core.paths import display_path
from helpers.placement.planner import Device, tensor_devices
from helpers.placement.strategies import validate_strategy

FORMAT = "offload/1"
ACCELERATE_LOGGERS = ("accelerate.utils.modeling", "accelerate.big_modeling")
# Lesson 05's proof: weights back from disk bit for bit, the same float32 kernels on the
# same device, so identical logits are expected; 1e-6 absolute is a chosen bound, not derived.
DISPATCH_TOLERANCE = 1e-6


def tensor_sha256(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes (as a file of the offload folder holds them)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return sha256_bytes(flat.view(torch.uint8).numpy().tobytes())


def disk_tensors(model: nn.Module, device_map: Mapping[str, Device]) -> dict[str, torch.Tensor]:
    """The parameters and buffers that ``device_map`` sends to ``"disk"``, by name."""
    on_disk = {n for n, d in tensor_devices(model, device_map).items() if d == "disk"}
    return {n: t for n, t in model.state_dict().items() if n in on_disk}


@dataclass(frozen=True)
class OffloadFolder:
    """A complete offload folder: where it is, what it holds, and whether it was reused."""

    path: Path
    tensors: dict[str, str]  # name -> sha256 of its file
    nbytes: int
    reused: bool

    def file_of(self, name: str) -> Path:
        """The file that holds tensor ``name``."""
        return self.path / f"{name}.dat"

    def describe(self) -> str:
        """Two lines: where, how many tensors, how many bytes; checksums verified."""
        return (
            f"{display_path(self.path)}/: {len(self.tensors)} tensor files + index.json + "
            f"{MANIFEST},\n  {self.nbytes:,} bytes, every file verified against its SHA-256"
        )


def write_offload_folder(tensors: Mapping[str, torch.Tensor], folder: str | Path) -> OffloadFolder:
    """Offload ``tensors`` to ``folder`` (accelerate's format) atomically; reuse it if it
    matches."""
    offload_state_dict = require("accelerate.utils", "disk offload").offload_state_dict
    if not tensors:
        raise ValueError("nothing to offload: the device map sends no tensor to 'disk'")
    folder = Path(folder)
    meta = {"format": FORMAT, "tensors": {n: tensor_sha256(t) for n, t in tensors.items()}}
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    reused = folder_matches(folder, meta)
    if not reused:
        cpu = {n: t.detach().cpu() for n, t in tensors.items()}
        write_verified_folder(folder, lambda tmp: offload_state_dict(str(tmp), cpu), meta=meta)
    return OffloadFolder(folder, meta["tensors"], nbytes, reused=reused)


def remove_offload_folder(folder: str | Path) -> None:
    """Delete an offload folder and any leftovers of interrupted writes beside it."""
    remove_verified_folder(folder)


def accelerate_balanced_memory(
    model: nn.Module,
    max_memory: Mapping[Device, int | str],
    *,
    low_zero: bool = False,
    no_split: list[str] | None = None,
    dtype: torch.dtype | None = None,
) -> dict[Device, int]:
    """``accelerate.utils.get_balanced_memory`` on these budgets (GPU indices may be hypothetical).

    It cannot read a ``"disk"`` key (``torch.device("disk")`` raises), so a disk budget is set
    aside while it balances and put back after: balancing concerns the GPUs only.
    """
    utils = require("accelerate.utils", "device_map='auto' planning")
    if no_split is None:
        no_split = list(getattr(model, "_no_split_modules", None) or [])
    budgets = dict(max_memory)  # accelerate converts the strings in place: work on a copy
    disk = budgets.pop("disk", None)
    with quiet_logs(ACCELERATE_LOGGERS, "is not available, available devices are"):
        balanced = dict(
            utils.get_balanced_memory(
                model, budgets, no_split_module_classes=no_split, dtype=dtype, low_zero=low_zero
            )
        )
    if disk is not None:
        balanced["disk"] = utils.convert_file_size_to_int(disk)
    return balanced


def accelerate_without_max_memory(
    model: nn.Module,
    free: Mapping[Device, int],
    *,
    strategy: str = "auto",
    no_split: list[str] | None = None,
) -> tuple[dict[Device, int], dict[str, Device]]:
    """What ``from_pretrained(device_map=strategy)`` plans when no ``max_memory`` is given,
    on a machine whose free memory per device is ``free`` (simulated: accelerate's
    ``get_max_memory`` is made to read ``free``). Returns the budgets the fill used and
    the map. Without ``max_memory``, ``get_balanced_memory`` keeps 10% of a single GPU
    free; ``"sequential"`` fills what is free as it is.
    """
    accelerate = require("accelerate", "device_map='auto' planning")
    modeling = require("accelerate.utils.modeling", "device_map='auto' planning")
    if no_split is None:
        no_split = list(getattr(model, "_no_split_modules", None) or [])
    budgets = dict(free)
    if validate_strategy(strategy) != "sequential":
        original = modeling.get_max_memory
        modeling.get_max_memory = lambda max_memory=None: dict(free if max_memory is None
                                                               else max_memory)
        try:
            with quiet_logs(ACCELERATE_LOGGERS, "is not available, available devices are"):
                budgets = dict(modeling.get_balanced_memory(
                    model, None, no_split_module_classes=no_split,
                    low_zero=strategy == "balanced_low_0"))
        finally:
            modeling.get_max_memory = original
    with quiet_logs(ACCELERATE_LOGGERS, "is not available, available devices are"):
        plan = dict(accelerate.infer_auto_device_map(model, max_memory=budgets,
                                                     no_split_module_classes=no_split))
    return budgets, plan


def accelerate_device_map(
    model: nn.Module,
    max_memory: Mapping[Device, int | str],
    *,
    strategy: str = "auto",
    no_split: list[str] | None = None,
    dtype: torch.dtype | None = None,
) -> dict[str, Device]:
    """What transformers' ``from_pretrained(device_map=strategy, max_memory=...)`` plans.

    As transformers does: for "auto", "balanced" and "balanced_low_0",
    ``get_balanced_memory`` (see :func:`accelerate_balanced_memory`) then
    ``infer_auto_device_map`` with those budgets; for "sequential", ``infer_auto_device_map``
    alone. On a machine without the GPUs named, accelerate logs "Device N is not available";
    planning is only arithmetic, so that one message is dropped.
    """
    accelerate = require("accelerate", "device_map='auto' planning")
    if no_split is None:
        no_split = list(getattr(model, "_no_split_modules", None) or [])
    budgets = dict(max_memory)
    if validate_strategy(strategy) != "sequential":
        low_zero = strategy == "balanced_low_0"
        budgets = accelerate_balanced_memory(
            model, budgets, low_zero=low_zero, no_split=no_split, dtype=dtype
        )
    with quiet_logs(ACCELERATE_LOGGERS, "is not available, available devices are"):
        return dict(
            accelerate.infer_auto_device_map(
                model, max_memory=budgets, no_split_module_classes=no_split, dtype=dtype
            )
        )


def dispatch_with_offload(
    model: nn.Module,
    device_map: Mapping[str, Device],
    folder: str | Path,
    *,
    main_device: torch.device | str | int | None = None,
) -> OffloadFolder | None:
    """Dispatch ``model`` in place along ``device_map``; its "disk" part goes to ``folder``.

    Returns the offload folder (``None`` when nothing goes to disk). The folder is written
    completely and verified before ``dispatch_model`` sees it.
    """
    accelerate = require("accelerate", "dispatching a model across devices")
    offload = None
    to_disk = disk_tensors(model, device_map)
    if to_disk:
        offload = write_offload_folder(to_disk, folder)
    with quiet_logs(ACCELERATE_LOGGERS, "Some parameters are on the meta device"):
        accelerate.dispatch_model(
            model,
            dict(device_map),
            main_device=main_device,
            offload_dir=str(offload.path) if offload else None,
        )
    return offload


def parameter_listing(
    model: nn.Module, device_map: Mapping[str, Device], offload: OffloadFolder | None = None
) -> str:
    """Each parameter's index, device and dtype as the source prints them, and where its data
    is (for a parameter on disk, its file in the offload folder, named in the header)."""
    placed = tensor_devices(model, device_map)
    width = max(len(n) for n, _ in model.named_parameters())
    lines = [f"(disk: a file in {display_path(offload.path)}/)"] if offload is not None else []
    lines.append(f"{'#':>3}  {'parameter':<{width}}  {'device':<7} {'dtype':<14} data")
    for i, (name, p) in enumerate(model.named_parameters()):
        if p.device.type != "meta":
            where = f"in memory on {p.device}"
        elif placed[name] == "disk" and offload is not None:
            where = f"disk: {offload.file_of(name).name}"
        else:
            where = f"{placed[name]}, copied in for each forward"
        lines.append(f"{i:>3}  {name:<{width}}  {str(p.device):<7} {str(p.dtype):<14} {where}")
    return "\n".join(lines)
