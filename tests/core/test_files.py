import hashlib
import os
import stat
from pathlib import Path

import pytest

from helpers.core import files
from helpers.core.errors import FolderError, ShardError
from helpers.core.files import MANIFEST


def test_atomic_write_and_checksum(tmp_path):
    path = files.atomic_write_bytes(tmp_path / "a" / "b.bin", b"abc")
    assert path.read_bytes() == b"abc"
    assert files.sha256_file(path) == hashlib.sha256(b"abc").hexdigest()
    assert sorted(p.name for p in path.parent.iterdir()) == ["b.bin"]


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "out.json"
    target.write_text("old")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        files.atomic_write_json(target, {"a": 1})
    assert target.read_text() == "old"  # the old file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_atomic_write_goes_through_a_hidden_sibling_and_is_world_readable(tmp_path, monkeypatch):
    renames = []
    real = files.os.replace

    def spy(src, dst):
        renames.append((Path(src), Path(dst)))
        real(src, dst)

    monkeypatch.setattr(files.os, "replace", spy)
    path = files.atomic_write_bytes(tmp_path / "a" / "b" / "c.bin", b"xyz")
    assert path.read_bytes() == b"xyz"
    ((src, dst),) = renames
    assert dst == path and src.parent == path.parent
    assert src.name.startswith(".c.bin.") and src.name.endswith(".tmp")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_a_failed_rename_reports_its_own_error_even_if_the_temporary_is_gone(tmp_path, monkeypatch):
    def vanish_then_fail(src, dst):
        os.unlink(src)
        raise OSError("rename failed (simulated)")

    monkeypatch.setattr(files.os, "replace", vanish_then_fail)
    with pytest.raises(OSError, match="rename failed"):
        files.atomic_write_bytes(tmp_path / "x.bin", b"1")
    assert list(tmp_path.iterdir()) == []


def test_json_is_written_indented_with_a_final_newline(tmp_path):
    path = files.atomic_write_json(tmp_path / "m.json", {"a": [1], "é": "ü"})
    assert (
        path.read_text(encoding="utf-8") == '{\n  "a": [\n    1\n  ],\n  "\\u00e9": "\\u00fc"\n}\n'
    )


def _folder(tmp_path, name="out", data=b"abc"):
    folder = tmp_path / name

    def fill(tmp):
        (tmp / "a.bin").write_bytes(data)

    files.write_verified_folder(folder, fill, meta={"kind": "test"})
    return folder


def test_verified_folder_is_filled_beside_its_target_and_lists_only_files(tmp_path):
    seen = []

    def fill(tmp):
        seen.append(tmp)
        (tmp / "a.bin").write_bytes(b"abc")
        (tmp / "sub").mkdir()

    folder = tmp_path / "x" / "y" / "out"
    manifest = files.write_verified_folder(folder, fill)
    assert seen[0].parent == folder.parent and seen[0].name.startswith(".out.tmp-")
    assert list(manifest["files"]) == ["a.bin"]
    assert sorted(p.name for p in folder.parent.iterdir()) == ["out"]


def test_stale_temporaries_are_removed_and_nothing_else(tmp_path):
    for name in (".out.tmp-1", ".out.old-2", ".out.keep"):
        (tmp_path / name).mkdir()
    (tmp_path / ".out.tmp-file").write_text("a file, not a leftover folder")
    _folder(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.keep", ".out.tmp-file", "out"]


def test_read_verified_names_what_is_wrong(tmp_path):
    folder = _folder(tmp_path)
    manifest = files.read_manifest(folder)
    with pytest.raises(FolderError, match=r"^manifest\.json lists no file nope$"):
        files.read_verified(folder, "nope", manifest)
    (folder / "a.bin").write_bytes(b"abd")
    with pytest.raises(
        ShardError, match=r"its sha256 is [0-9a-f]{16}\.\.\., expected [0-9a-f]{16}\.\.\.; the file"
    ):
        files.verify_folder(folder, ShardError)
    (folder / MANIFEST).unlink()
    with pytest.raises(ShardError, match="manifest.json is missing"):
        files.verify_folder(folder, ShardError)


def test_replace_and_remove_refuse_foreign_content(tmp_path):
    (tmp_path / "plain").write_text("x")
    with pytest.raises(FolderError, match=r"^plain is a file, not a folder; choose another path$"):
        files.write_verified_folder(tmp_path / "plain", lambda tmp: None)
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in "dcba":
        (mine / name).write_text(name)
    with pytest.raises(
        FolderError,
        match=r"\(a, b, c\); refusing to replace it; valid: a new folder, or one written by this series$",
    ):
        files.remove_verified_folder(mine)
    files.remove_verified_folder(tmp_path / "never-written")  # nothing there: no error
    folder = _folder(tmp_path)
    files.remove_verified_folder(folder)
    assert not folder.exists()
