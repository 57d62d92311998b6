"""Files a reader can trust: atomic writes, and folders verified by a SHA-256 manifest.

A verified folder (the tensor-parallel shard files, the offloaded weights) is written
into a temporary sibling, every file's length and SHA-256 go into ``manifest.json``, the
copy is read back and checked, and only then is it renamed into place: a reader sees the
old complete folder or the new complete folder, never a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from helpers.core.errors import FolderError
from helpers.core.paths import display_path

MANIFEST = "manifest.json"


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write UTF-8 ``text`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- verified folders ------------------------------------------------------------------


def read_manifest(folder: str | Path, error: type[FolderError] = FolderError) -> dict:
    """The manifest of a verified folder; ``error`` when it is missing or unreadable."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise error(
            f"{display_path(path)} is missing: {display_path(folder)} holds no complete set"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise error(f"{display_path(path)} is not readable JSON ({exc}); write it again") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise error(f"{display_path(path)} lists no files; write the folder again")
    return manifest


def read_verified(
    folder: str | Path, name: str, manifest: Mapping, error: type[FolderError] = FolderError
) -> bytes:
    """The bytes of file ``name``, checked for presence, length and SHA-256 against ``manifest``."""
    path = Path(folder) / name
    entry = manifest["files"].get(name)
    if entry is None:
        raise error(f"{display_path(Path(folder) / MANIFEST)} lists no file {name}")
    if not path.is_file():
        raise error(
            f"{display_path(path)} is missing; expected {entry['bytes']} bytes, as the manifest lists"
        )
    data = path.read_bytes()
    if len(data) != entry["bytes"]:
        raise error(
            f"{display_path(path)} has {len(data)} bytes; expected {entry['bytes']}: the file is "
            "truncated or comes from another configuration; write it again"
        )
    digest = sha256_bytes(data)
    if digest != entry["sha256"]:
        raise error(
            f"{display_path(path)} does not match the manifest: its sha256 is {digest[:16]}..., "
            f"expected {entry['sha256'][:16]}...; the file changed after it was written"
        )
    return data


def verify_folder(folder: str | Path, error: type[FolderError] = FolderError) -> dict:
    """Check every file the manifest lists; return the manifest."""
    manifest = read_manifest(folder, error)
    for name in manifest["files"]:
        read_verified(folder, name, manifest, error)
    return manifest


def folder_matches(folder: str | Path, meta: Mapping) -> bool:
    """True when ``folder`` verifies and its manifest records ``meta``."""
    try:
        manifest = verify_folder(folder)
    except FolderError:
        return False
    return all(manifest.get(k) == v for k, v in meta.items())


def _check_replaceable(folder: Path) -> None:
    """Refuse to replace a folder holding anything its manifest does not list."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise FolderError(f"{display_path(folder)} is a file, not a folder; choose another path")
    try:
        listed = set(read_manifest(folder)["files"])
    except FolderError:
        listed = set()
    strangers = sorted(p.name for p in folder.iterdir() if p.name not in listed | {MANIFEST})
    if strangers:
        raise FolderError(
            f"{display_path(folder)} holds files its manifest does not list "
            f"({', '.join(strangers[:3])}); refusing to replace it; valid: a new folder, "
            "or one written by this series"
        )


def _remove_leftovers(folder: Path) -> None:
    """Delete temporary siblings that an interrupted earlier write left behind."""
    for stale in folder.parent.glob(f".{folder.name}.*"):
        if stale.is_dir() and (".tmp-" in stale.name or ".old-" in stale.name):
            shutil.rmtree(stale, ignore_errors=True)


def write_verified_folder(
    folder: str | Path,
    fill: Callable[[Path], None],
    *,
    meta: Mapping | None = None,
    file_meta: Mapping[str, dict] | None = None,
) -> dict:
    """``fill`` a temporary sibling of ``folder``, add the manifest, verify, swap into place."""
    folder = Path(folder)
    _check_replaceable(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(folder)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.tmp-"))
    try:
        fill(tmp)
        files = {
            p.name: {
                **(file_meta or {}).get(p.name, {}),
                "bytes": p.stat().st_size,
                "sha256": sha256_file(p),
            }
            for p in sorted(tmp.iterdir())
            if p.is_file() and p.name != MANIFEST
        }
        manifest = {**(meta or {}), "files": files}
        atomic_write_json(tmp / MANIFEST, manifest)
        verify_folder(tmp)
        old = folder.with_name(f".{folder.name}.old-{uuid.uuid4().hex[:8]}")
        if folder.exists():
            os.replace(folder, old)  # move the previous folder aside whole ...
        os.replace(tmp, folder)  # ... and put the complete new one in its place
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def remove_verified_folder(folder: str | Path) -> None:
    """Delete a folder written by ``write_verified_folder`` and any leftovers beside it."""
    folder = Path(folder)
    _check_replaceable(folder)
    shutil.rmtree(folder, ignore_errors=True)
    _remove_leftovers(folder)
