import hashlib

import pytest

from helpers.core import files


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
