"""The tensor-parallel FFN's weights as one file per rank and layer, checked on load.

The format is the source's: ``fc1_{rank}.bin`` holds rank ``rank``'s chunk of
``fc1.weight`` split along dim 0, ``fc2_{rank}.bin`` its chunk of ``fc2.weight`` split
along dim 1; raw float32, little-endian, C order, no header. A raw file cannot tell its
own shape, so the folder's ``manifest.json`` records the sizes and each file's shape,
length and SHA-256; loading checks all of it before any data is reshaped. The folder is
written and replaced whole (``helpers.core.files.write_verified_folder``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from helpers.core.errors import ShardError
from helpers.core.files import (
    MANIFEST,
    atomic_write_bytes,
    read_manifest,
    read_verified,
    write_verified_folder,
)
from helpers.core.paths import display_path
from helpers.tensor_parallel.ffn import FeedForward, FeedForwardShard, split_weights, validate_split

FORMAT = "tp-ffn-shards/1"
FILE_DTYPE = np.dtype("<f4")  # float32, little-endian: the bytes numpy's tofile writes on x86/ARM


def shard_file_names(rank: int) -> tuple[str, str]:
    """The source's names for rank ``rank``'s two files."""
    return f"fc1_{rank}.bin", f"fc2_{rank}.bin"


def chunk_file_bytes(t: torch.Tensor) -> bytes:
    """A weight chunk as raw float32 in C order, as ``chunk.numpy().tofile(...)`` writes it."""
    array = t.detach().to("cpu", torch.float32).numpy()
    return np.ascontiguousarray(array, dtype=FILE_DTYPE).tobytes(order="C")


def write_shards(model: FeedForward, world_size: int, folder: str | Path) -> Path:
    """Write ``model``'s shards for ``world_size`` ranks into ``folder``; returns the manifest path."""
    ffn_size, hidden_size = model.fc1.weight.shape
    validate_split(ffn_size, world_size)
    payloads, file_meta = {}, {}
    for rank, (fc1, fc2) in enumerate(split_weights(model, world_size)):
        for name, tensor, dim in zip(shard_file_names(rank), (fc1, fc2), (0, 1), strict=True):
            payloads[name] = chunk_file_bytes(tensor)  # prepared before touching the disk
            file_meta[name] = {
                "tensor": f"{name[:3]}.weight",
                "rank": rank,
                "split_dim": dim,
                "shape": list(tensor.shape),
            }

    def fill(tmp: Path) -> None:
        for name, data in payloads.items():
            atomic_write_bytes(tmp / name, data)

    meta = {
        "format": FORMAT,
        "world_size": world_size,
        "hidden_size": int(hidden_size),
        "ffn_size": int(ffn_size),
        "dtype": "float32",
        "byte_order": "little",
        "order": "C",
    }
    write_verified_folder(folder, fill, meta=meta, file_meta=file_meta)
    return Path(folder) / MANIFEST


def read_shard_manifest(folder: str | Path) -> dict:
    """The manifest of a shard folder, checked for the fields loading needs."""
    try:
        manifest = read_manifest(folder, ShardError)
    except ShardError as error:
        raise ShardError(
            f"{error}; write the shards first (write_shards, or "
            "`python -m helpers.tp_demo --world_size N --shard_dir DIR` in native mode)"
        ) from None
    missing = [k for k in ("format", "world_size", "hidden_size", "ffn_size") if k not in manifest]
    if missing or manifest.get("format") != FORMAT:
        raise ShardError(
            f"{display_path(Path(folder) / MANIFEST)} is not a shard manifest of format "
            f"{FORMAT!r} (missing: {', '.join(missing) or 'none'}); rewrite the shards"
        )
    return manifest


def _read_chunk(folder: Path, name: str, manifest: dict, shape: tuple[int, int]) -> torch.Tensor:
    """One file, its recorded shape checked against the sizes, then its bytes verified."""
    entry = manifest["files"].get(name, {})
    expected = shape[0] * shape[1] * FILE_DTYPE.itemsize
    if list(entry.get("shape", [])) != list(shape) or entry.get("bytes") != expected:
        raise ShardError(
            f"{display_path(folder / MANIFEST)} describes {name} as {entry.get('shape')} "
            f"({entry.get('bytes')} bytes) but the sizes it records need {expected} bytes = "
            f"float32 {shape[0]}x{shape[1]}; rewrite the shards"
        )
    data = read_verified(folder, name, manifest, ShardError)
    array = np.frombuffer(data, dtype=FILE_DTYPE).reshape(shape)  # length checked above
    return torch.from_numpy(array.astype(np.float32))


def load_shard(
    folder: str | Path,
    world_size: int,
    rank: int,
    *,
    hidden_size: int | None = None,
    ffn_size: int | None = None,
    activation: str = "none",
) -> FeedForwardShard:
    """Rank ``rank``'s shard from the files for ``world_size`` ranks, every file checked first."""
    folder = Path(folder)
    manifest = read_shard_manifest(folder)
    if manifest["world_size"] != world_size:
        raise ShardError(
            f"{display_path(folder / MANIFEST)} was written for world size {manifest['world_size']}, "
            f"but world size {world_size} was asked for; rewrite the shards with "
            f"--world_size {world_size} or launch {manifest['world_size']} ranks"
        )
    for key, wanted in (("hidden_size", hidden_size), ("ffn_size", ffn_size)):
        if wanted is not None and manifest[key] != wanted:
            raise ShardError(
                f"{display_path(folder / MANIFEST)} was written for {key} {manifest[key]}, "
                f"but {key} {wanted} was asked for; rewrite the shards with --{key} {wanted}"
            )
    hidden, ffn = manifest["hidden_size"], manifest["ffn_size"]
    shard = FeedForwardShard(hidden, ffn, world_size, rank, activation)
    per_rank = validate_split(ffn, world_size)
    fc1_name, fc2_name = shard_file_names(rank)
    fc1 = _read_chunk(folder, fc1_name, manifest, (per_rank, hidden))
    fc2 = _read_chunk(folder, fc2_name, manifest, (hidden, per_rank))
    return shard.load_weights(fc1, fc2)


def describe_shards(folder: str | Path) -> str:
    """A table of the shard files: name, tensor, split dim, shape, bytes on disk, sha256 prefix."""
    folder = Path(folder)
    manifest = read_shard_manifest(folder)
    lines = [
        f"{display_path(folder)}: world size {manifest['world_size']}, hidden "
        f"{manifest['hidden_size']}, ffn {manifest['ffn_size']}, {manifest['dtype']} "
        f"{manifest['byte_order']}-endian, {manifest['order']} order",
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
