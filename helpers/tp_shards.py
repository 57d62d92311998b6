"""The tensor-parallel FFN's weights as one file per rank and layer, checked on load.

The format is the source's: ``fc1_{rank}.bin`` holds rank ``rank``'s chunk of
``fc1.weight`` split along dim 0, ``fc2_{rank}.bin`` its chunk of ``fc2.weight`` split
along dim 1; raw float32, little-endian, C order, no header. A raw file cannot tell
its own shape, so a ``manifest.json`` beside them records the world size, the sizes,
each file's shape, length and SHA-256. Loading checks all of it before any data is
reshaped.

Writing is safe to interrupt: the new files and manifest are first written (each
atomically) into a hidden staging folder beside the old ones, which stay valid; only
then are they renamed into place, the manifest last. An error while writing leaves the
old set as it was and no partial file behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from helpers.files import atomic_write_bytes, atomic_write_json
from helpers.paths import shown
from helpers.tp_ffn import FeedForward, check_split, split_weights

MANIFEST = "manifest.json"
FORMAT = "tp-ffn-shards/1"
FILE_DTYPE = np.dtype("<f4")  # float32, little-endian: the bytes numpy's tofile writes on x86/ARM
_SHARD_FILE = re.compile(r"fc[12]_(\d+)\.bin")


class ShardError(RuntimeError):
    """Shard files that are missing, corrupt, or written for another configuration."""


def shard_file_names(rank: int) -> tuple[str, str]:
    """The source's names for rank ``rank``'s two files."""
    return f"fc1_{rank}.bin", f"fc2_{rank}.bin"


def tensor_bytes(t: torch.Tensor) -> bytes:
    """A weight chunk as raw float32 in C order, as ``chunk.numpy().tofile(...)`` writes it."""
    array = t.detach().to("cpu", torch.float32).numpy()
    return np.ascontiguousarray(array, dtype=FILE_DTYPE).tobytes(order="C")


def write_shards(model: FeedForward, world_size: int, folder: str | Path) -> Path:
    """Write ``model``'s shards for ``world_size`` ranks into ``folder``; returns the manifest path."""
    ffn_size, hidden_size = model.fc1.weight.shape
    check_split(ffn_size, world_size)
    folder = Path(folder)
    payloads: list[tuple[str, dict, bytes]] = []  # everything prepared before touching the disk
    for rank, (fc1, fc2) in enumerate(split_weights(model, world_size)):
        for name, tensor, dim in zip(shard_file_names(rank), (fc1, fc2), (0, 1), strict=True):
            data = tensor_bytes(tensor)
            entry = {
                "tensor": f"{name[:3]}.weight",
                "rank": rank,
                "split_dim": dim,
                "shape": list(tensor.shape),
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
            payloads.append((name, entry, data))
    manifest = {
        "format": FORMAT,
        "world_size": world_size,
        "hidden_size": int(hidden_size),
        "ffn_size": int(ffn_size),
        "dtype": "float32",
        "byte_order": "little",
        "order": "C",
        "files": {name: entry for name, entry, _ in payloads},
    }
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / MANIFEST
    staging = Path(tempfile.mkdtemp(dir=folder, prefix=".staging-"))
    try:
        for name, _, data in payloads:  # the slow part, where a full disk would fail
            atomic_write_bytes(staging / name, data)
        atomic_write_json(staging / MANIFEST, manifest)
        manifest_path.unlink(missing_ok=True)  # the folder is invalid from here ...
        for name, _, _ in payloads:
            os.replace(staging / name, folder / name)
        for stale in folder.glob("fc[12]_*.bin"):  # shards of a larger world size
            match = _SHARD_FILE.fullmatch(stale.name)
            if match and int(match.group(1)) >= world_size:
                stale.unlink()
        os.replace(staging / MANIFEST, manifest_path)  # ... to here
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest_path


def read_manifest(folder: str | Path) -> dict:
    """The manifest of a shard folder, checked for the fields loading needs."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ShardError(
            f"{shown(path)} is missing: no complete set of shards was written in "
            f"{shown(folder)}; write them first (write_shards, or "
            "`python -m helpers.tp_demo --world_size N --shard_dir DIR` in native mode)"
        )
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ShardError(
            f"{shown(path)} is not readable JSON ({error}); rewrite the shards"
        ) from None
    required = ("format", "world_size", "hidden_size", "ffn_size", "files")
    missing = [k for k in required if k not in manifest] if isinstance(manifest, dict) else required
    if missing or manifest.get("format") != FORMAT:
        raise ShardError(
            f"{shown(path)} is not a shard manifest of format {FORMAT!r} "
            f"(missing: {', '.join(missing) or 'none'}); rewrite the shards"
        )
    return manifest


def _read_checked(folder: Path, name: str, manifest: dict, shape: tuple[int, int]) -> torch.Tensor:
    """One file's bytes, checked for presence, length and SHA-256, then shaped."""
    path = folder / name
    entry = manifest["files"].get(name)
    if entry is None:
        raise ShardError(f"{shown(folder / MANIFEST)} lists no file {name}; rewrite the shards")
    expected = shape[0] * shape[1] * FILE_DTYPE.itemsize
    what = f"{expected} bytes = float32 {shape[0]}x{shape[1]}"
    if list(entry.get("shape", [])) != list(shape) or entry.get("bytes") != expected:
        raise ShardError(
            f"{shown(folder / MANIFEST)} describes {name} as {entry.get('shape')} "
            f"({entry.get('bytes')} bytes) but the sizes it records need {what}; rewrite the shards"
        )
    if not path.is_file():
        raise ShardError(f"{shown(path)} is missing; expected {what}, as the manifest lists")
    data = path.read_bytes()
    if len(data) != expected:
        raise ShardError(
            f"{shown(path)} has {len(data)} bytes; expected {what}: the file is truncated "
            "or comes from another configuration; rewrite the shards"
        )
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.get("sha256"):
        raise ShardError(
            f"{shown(path)} does not match the manifest: its sha256 is {digest[:16]}..., "
            f"expected {str(entry.get('sha256'))[:16]}...; the file changed after it was "
            "written; rewrite the shards"
        )
    array = np.frombuffer(data, dtype=FILE_DTYPE).reshape(shape)  # size checked above
    return torch.from_numpy(array.astype(np.float32))


def load_shard(
    folder: str | Path,
    world_size: int,
    rank: int,
    *,
    hidden_size: int | None = None,
    ffn_size: int | None = None,
) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """(manifest, fc1 chunk, fc2 chunk) of rank ``rank``, every file checked first."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest["world_size"] != world_size:
        raise ShardError(
            f"{shown(folder / MANIFEST)} was written for world size {manifest['world_size']}, "
            f"but world size {world_size} was asked for; rewrite the shards with "
            f"--world_size {world_size} or launch {manifest['world_size']} ranks"
        )
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r}; valid: 0 .. {world_size - 1} for world size {world_size}")
    for key, wanted in (("hidden_size", hidden_size), ("ffn_size", ffn_size)):
        if wanted is not None and manifest[key] != wanted:
            raise ShardError(
                f"{shown(folder / MANIFEST)} was written for {key} {manifest[key]}, "
                f"but {key} {wanted} was asked for; rewrite the shards with --{key} {wanted}"
            )
    per_rank = check_split(manifest["ffn_size"], world_size)
    hidden = manifest["hidden_size"]
    fc1_name, fc2_name = shard_file_names(rank)
    fc1 = _read_checked(folder, fc1_name, manifest, (per_rank, hidden))
    fc2 = _read_checked(folder, fc2_name, manifest, (hidden, per_rank))
    return manifest, fc1, fc2


def describe_shards(folder: str | Path) -> str:
    """A table of the shard files: name, tensor, split dim, shape, bytes on disk, sha256 prefix."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    lines = [
        f"{shown(folder)}: world size {manifest['world_size']}, hidden {manifest['hidden_size']}, "
        f"ffn {manifest['ffn_size']}, {manifest.get('dtype', 'float32')} "
        f"{manifest.get('byte_order', 'little')}-endian, {manifest.get('order', 'C')} order",
        f"{'file':<10} {'tensor':<11} {'split':>5} {'shape':<12} {'bytes':>9}  sha256",
    ]
    for name, e in manifest["files"].items():
        size = (folder / name).stat().st_size if (folder / name).exists() else "missing"
        shape = "x".join(map(str, e["shape"]))
        lines.append(
            f"{name:<10} {e['tensor']:<11} {'dim ' + str(e['split_dim']):>5} {shape:<12} "
            f"{size:>9}  {e['sha256'][:16]}..."
        )
    return "\n".join(lines)
