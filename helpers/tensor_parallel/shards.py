"""A tensor-parallel block's weights as one file per rank and split weight, checked on load.

The format is the source's: ``fc1_{rank}.bin`` holds rank ``rank``'s chunk of
``fc1.weight`` split along dim 0, ``fc2_{rank}.bin`` its chunk of ``fc2.weight`` split
along dim 1; raw float32, little-endian, C order, no header. A raw file cannot tell its
own shape, so the folder's ``manifest.json`` records the sizes and each file's shape,
length and SHA-256; loading checks all of it before any data is reshaped. The folder is
written and replaced whole (``helpers.core.files.write_verified_folder``). The files are
named and cut by the block's ``splits()`` (``helpers.tensor_parallel.block``), so another
block's shards are written by the same code.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from helpers.core.errors import ShardError
from helpers.core.files import (
    MANIFEST,
    atomic_write_bytes,
    read_manifest,
    read_verified,
    write_verified_folder,
)
from helpers.core.paths import display_path
from helpers.tensor_parallel.block import ParallelBlock, chunks, load_chunks
from helpers.tensor_parallel.ffn import SPLITS, FeedForwardShard

FORMAT = "tp-ffn-shards/1"
FILE_DTYPE = np.dtype("<f4")  # float32, little-endian: the bytes numpy's tofile writes on x86/ARM


def chunk_file_bytes(t: torch.Tensor) -> bytes:
    """A weight chunk as raw float32 in C order, as ``chunk.numpy().tofile(...)`` writes it."""
    array = t.detach().to("cpu", torch.float32).numpy()
    return np.ascontiguousarray(array, dtype=FILE_DTYPE).tobytes(order="C")


def write_shards(model: ParallelBlock, world_size: int, folder: str | Path) -> Path:
    """Write ``model``'s shards for ``world_size`` ranks into ``folder``; returns the manifest path.

    One file per rank and split weight (the block's ``splits()``: for the FFN the source's
    ``fc1_{rank}.bin`` and ``fc2_{rank}.bin``); the manifest records the block's ``sizes()``.
    """
    payloads, file_meta = {}, {}
    for rank, parts in enumerate(chunks(model, world_size)):
        for s in model.splits():
            name, tensor = s.file(rank), parts[s.tensor]
            payloads[name] = chunk_file_bytes(tensor)  # prepared before touching the disk
            file_meta[name] = {
                "tensor": s.tensor,
                "rank": rank,
                "split_dim": s.dim,
                "shape": list(tensor.shape),
            }

    def fill(tmp: Path) -> None:
        for name, data in payloads.items():
            atomic_write_bytes(tmp / name, data)

    meta = {
        "format": FORMAT,
        "world_size": world_size,
        **model.sizes(),
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


def read_chunks(folder: Path, manifest: dict, shard: nn.Module, splits, rank: int) -> nn.Module:
    """Each split weight's file, its recorded shape checked against the shard's parameter,
    then its bytes verified, then copied in; the shard."""
    parts = {}
    for s in splits:
        name, shape = s.file(rank), tuple(shard.get_parameter(s.tensor).shape)
        entry = manifest["files"].get(name, {})
        expected = math.prod(shape) * FILE_DTYPE.itemsize
        if list(entry.get("shape", [])) != list(shape) or entry.get("bytes") != expected:
            raise ShardError(
                f"{display_path(folder / MANIFEST)} describes {name} as {entry.get('shape')} "
                f"({entry.get('bytes')} bytes) but the sizes it records need {expected} bytes = "
                f"float32 {'x'.join(map(str, shape))}; rewrite the shards"
            )
        data = read_verified(folder, name, manifest, ShardError)
        array = np.frombuffer(data, dtype=FILE_DTYPE).reshape(shape)  # length checked above
        parts[s.tensor] = torch.from_numpy(array.astype(np.float32))
    return load_chunks(shard, parts)


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
    return read_chunks(folder, manifest, shard, SPLITS, rank)


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
