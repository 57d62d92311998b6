"""Lesson 04: run a model whose layers live on GPU, CPU and disk, with accelerate.

``accelerate.dispatch_model`` attaches a hook to every module: before the module runs,
its weights are brought to the execution device (from CPU memory, or read back from a
file of the offload folder), and after it runs they are dropped again. The offloaded
parameters themselves stay on the ``meta`` device: a shape and a dtype, no data.

``dispatch_model`` writes the offload folder itself when it finds no ``index.json``
there, file after file, and reuses any folder that has one, even a half-written or stale
one. So we write the folder ourselves first: into a temporary sibling, with a manifest
of SHA-256 checksums, renamed into place only when complete. A folder whose manifest
matches the weights to offload and whose files match the manifest is reused; any other
is replaced. ``dispatch_model`` then finds a complete, verified folder and only reads it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from helpers.device_map import Device, tensor_devices
from helpers.files import atomic_write_json, sha256_file
from helpers.optional import require
from helpers.paths import shown

MANIFEST = "manifest.json"


def tensor_sha256(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes (as a file of the offload folder holds them)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()


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
        """One line: where, how many tensors, how many bytes; checksums verified."""
        return (
            f"{shown(self.path)}/: {len(self.tensors)} tensor files + index.json + {MANIFEST}, "
            f"{self.nbytes:,} bytes, every file verified against its SHA-256"
        )


def _verified(folder: Path, expected: dict[str, str]) -> bool:
    """True when ``folder`` is complete for ``expected`` (name -> sha256) and its files match."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if manifest.get("tensors") != expected or not (folder / "index.json").is_file():
        return False
    return all(
        (folder / f"{n}.dat").is_file() and sha256_file(folder / f"{n}.dat") == sha
        for n, sha in expected.items()
    )


def _check_replaceable(folder: Path) -> None:
    """Refuse to replace or delete a folder that holds anything but offloaded weights."""
    if not folder.exists():
        return
    ours = {"index.json", MANIFEST}
    others = [] if folder.is_dir() else [folder.name]
    if folder.is_dir():
        others = [p.name for p in folder.iterdir() if p.name not in ours and p.suffix != ".dat"]
    if others:
        raise ValueError(
            f"{shown(folder)} holds files that are not offloaded weights "
            f"({', '.join(sorted(others)[:3])}); refusing to replace it; "
            "valid: a new folder, or one this module wrote"
        )


def _remove_leftovers(folder: Path) -> None:
    """Delete temporary siblings that an interrupted earlier write left behind."""
    for stale in folder.parent.glob(f".{folder.name}.*"):
        if stale.is_dir() and (".tmp-" in stale.name or ".old-" in stale.name):
            shutil.rmtree(stale, ignore_errors=True)


def write_offload_folder(tensors: Mapping[str, torch.Tensor], folder: str | Path) -> OffloadFolder:
    """Offload ``tensors`` to ``folder`` (accelerate's format), atomically; reuse it if it matches."""
    offload_state_dict = require("accelerate.utils", "disk offload").offload_state_dict
    if not tensors:
        raise ValueError("nothing to offload: the device map sends no tensor to 'disk'")
    folder = Path(folder)
    expected = {n: tensor_sha256(t) for n, t in tensors.items()}
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    if _verified(folder, expected):
        return OffloadFolder(folder, expected, nbytes, reused=True)
    _check_replaceable(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(folder)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.tmp-"))
    try:
        offload_state_dict(str(tmp), {n: t.detach().cpu() for n, t in tensors.items()})
        atomic_write_json(tmp / MANIFEST, {"tensors": expected})
        if not _verified(tmp, expected):
            raise OSError(f"the offload files written to {shown(tmp)} do not match their checksums")
        old = folder.with_name(f".{folder.name}.old-{uuid.uuid4().hex[:8]}")
        if folder.exists():
            os.replace(folder, old)  # move the previous folder aside whole ...
        os.replace(tmp, folder)  # ... and put the complete new one in its place
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return OffloadFolder(folder, expected, nbytes, reused=False)


def remove_offload_folder(folder: str | Path) -> None:
    """Delete an offload folder and any leftovers of interrupted writes beside it."""
    folder = Path(folder)
    _check_replaceable(folder)
    shutil.rmtree(folder, ignore_errors=True)
    _remove_leftovers(folder)


class _DropMessages(logging.Filter):
    def __init__(self, fragments: tuple[str, ...]) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(f in record.getMessage() for f in self.fragments)


@contextmanager
def quiet_accelerate(*fragments: str) -> Iterator[None]:
    """Drop accelerate log messages containing one of ``fragments`` (and only those)."""
    loggers = [
        logging.getLogger(n) for n in ("accelerate.utils.modeling", "accelerate.big_modeling")
    ]
    drop = _DropMessages(fragments)
    for logger in loggers:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)


def accelerate_device_map(
    model: nn.Module,
    max_memory: Mapping[Device, int | str],
    *,
    no_split: list[str] | None = None,
    dtype: torch.dtype | None = None,
) -> dict[str, Device]:
    """``accelerate.infer_auto_device_map`` with these budgets (GPU indices may be hypothetical).

    On a machine without those GPUs accelerate logs "Device N is not available"; planning is
    only arithmetic, so that one message is dropped.
    """
    accelerate = require("accelerate", "device_map='auto' planning")
    if no_split is None:
        no_split = list(getattr(model, "_no_split_modules", None) or [])
    with quiet_accelerate("is not available, available devices are"):
        return dict(
            accelerate.infer_auto_device_map(
                model, max_memory=dict(max_memory), no_split_module_classes=no_split, dtype=dtype
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
    with quiet_accelerate("Some parameters are on the meta device"):
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
    """Each parameter's index, device and dtype as the source prints them, and where its data is."""
    placed = tensor_devices(model, device_map)
    width = max(len(n) for n, _ in model.named_parameters())
    lines = [f"{'#':>3}  {'parameter':<{width}}  {'device':<7} {'dtype':<14} data"]
    for i, (name, p) in enumerate(model.named_parameters()):
        if p.device.type != "meta":
            where = f"in memory on {p.device}"
        elif placed[name] == "disk" and offload is not None:
            where = f"on disk: {shown(offload.file_of(name))}"
        else:
            where = f"offloaded to {placed[name]}, copied to the execution device for each forward"
        lines.append(f"{i:>3}  {name:<{width}}  {str(p.device):<7} {str(p.dtype):<14} {where}")
    return "\n".join(lines)
