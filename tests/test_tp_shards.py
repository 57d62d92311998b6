"""Shard files: the source's bytes, round trip, and clear errors for every kind of damage."""

import json

import numpy as np
import pytest
import torch
from torch import nn

import helpers.tensor_parallel.shards as tp_shards
from helpers.tensor_parallel.ffn import FeedForward
from helpers.tensor_parallel.shards import (
    MANIFEST,
    ShardError,
    describe_shards,
    load_shard,
    write_shards,
)


def _model(hidden=32, ffn=64):
    torch.manual_seed(1)
    return FeedForward(hidden, ffn)


def _source_writes(folder, hidden_size, ffn_size, world_size):
    """The source's weight-writing part, with its files sent to ``folder`` instead of the cwd."""

    class SourceFeedForward(nn.Module):
        def __init__(self, hidden_size, ffn_size):
            super().__init__()
            self.fc1 = nn.Linear(hidden_size, ffn_size, bias=False)
            self.fc2 = nn.Linear(ffn_size, hidden_size, bias=False)

    torch.random.manual_seed(1)
    model = SourceFeedForward(hidden_size, ffn_size)
    for idx, chunk in enumerate(torch.split(model.fc1.weight, ffn_size // world_size, dim=0)):
        chunk.data.numpy().tofile(folder / f"fc1_{idx}.bin")
    for idx, chunk in enumerate(torch.split(model.fc2.weight, ffn_size // world_size, dim=1)):
        chunk.data.numpy().tofile(folder / f"fc2_{idx}.bin")


@pytest.mark.parametrize(("hidden", "ffn", "world"), [(128, 512, 4), (48, 96, 3), (16, 64, 1)])
def test_files_are_byte_identical_to_the_sources(tmp_path, hidden, ffn, world):
    (tmp_path / "source").mkdir()
    _source_writes(tmp_path / "source", hidden, ffn, world)
    torch.manual_seed(1)
    write_shards(FeedForward(hidden, ffn), world, tmp_path / "ours")
    source_files = sorted(p.name for p in (tmp_path / "source").iterdir())
    assert source_files == sorted(p.name for p in (tmp_path / "ours").glob("*.bin"))
    assert len(source_files) == 2 * world
    for name in source_files:
        assert (tmp_path / "source" / name).read_bytes() == (tmp_path / "ours" / name).read_bytes()


def test_round_trip_and_manifest(tmp_path):
    model = _model()
    write_shards(model, 4, tmp_path)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest["world_size"] == 4 and manifest["hidden_size"] == 32
    assert manifest["ffn_size"] == 64 and manifest["dtype"] == "float32"
    assert manifest["files"]["fc2_3.bin"]["shape"] == [32, 16]
    assert manifest["files"]["fc2_3.bin"]["bytes"] == 32 * 16 * 4
    for rank in range(4):
        shard = load_shard(tmp_path, 4, rank, hidden_size=32, ffn_size=64)
        assert torch.equal(shard.fc1.weight, model.fc1.weight[16 * rank : 16 * (rank + 1)])
        assert torch.equal(shard.fc2.weight, model.fc2.weight[:, 16 * rank : 16 * (rank + 1)])
    raw = np.fromfile(tmp_path / "fc2_1.bin", dtype=np.float32).reshape(32, 16)
    assert np.array_equal(raw, model.fc2.weight.detach()[:, 16:32].numpy())
    assert "fc2_3.bin" in describe_shards(tmp_path)


def test_rewriting_for_fewer_ranks_removes_the_old_files(tmp_path):
    write_shards(_model(), 4, tmp_path)
    write_shards(_model(), 2, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fc1_0.bin",
        "fc1_1.bin",
        "fc2_0.bin",
        "fc2_1.bin",
        MANIFEST,
    ]


def test_missing_manifest(tmp_path):
    with pytest.raises(
        ShardError,
        match=r"manifest.json is missing: .* holds no complete set; write the shards first",
    ):
        load_shard(tmp_path, 2, 0)


def test_missing_file(tmp_path):
    write_shards(_model(), 2, tmp_path)
    (tmp_path / "fc2_1.bin").unlink()
    load_shard(tmp_path, 2, 0)  # rank 0's files are intact
    with pytest.raises(ShardError, match=r"fc2_1.bin is missing; expected 4096 bytes"):
        load_shard(tmp_path, 2, 1)


def test_truncated_file_is_never_reshaped(tmp_path):
    write_shards(_model(), 2, tmp_path)
    path = tmp_path / "fc1_0.bin"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(
        ShardError, match=r"fc1_0.bin has 4092 bytes; expected 4096: the file is truncated"
    ):
        load_shard(tmp_path, 2, 0)


def test_changed_bytes_fail_the_checksum(tmp_path):
    write_shards(_model(), 2, tmp_path)
    path = tmp_path / "fc1_1.bin"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=r"fc1_1.bin does not match the manifest: its sha256 is"):
        load_shard(tmp_path, 2, 1)


def test_manifest_from_another_world_size(tmp_path):
    write_shards(_model(), 4, tmp_path)
    with pytest.raises(ShardError, match=r"written for world size 4, but world size 2 was asked"):
        load_shard(tmp_path, 2, 0)
    with pytest.raises(ShardError, match=r"written for hidden_size 32, but hidden_size 64"):
        load_shard(tmp_path, 4, 0, hidden_size=64)
    with pytest.raises(ValueError, match=r"rank=4; valid: 0 \.\. 3"):
        load_shard(tmp_path, 4, 4)


def test_broken_manifest(tmp_path):
    write_shards(_model(), 2, tmp_path)
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(ShardError, match=r"manifest.json is not readable JSON"):
        load_shard(tmp_path, 2, 0)
    (tmp_path / MANIFEST).write_text("{}")
    with pytest.raises(ShardError, match=r"lists no files"):
        load_shard(tmp_path, 2, 0)


def test_bad_split_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match="not divisible by world_size=3"):
        write_shards(_model(), 3, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_failure_while_writing_keeps_the_old_shards_and_leaves_nothing_half_written(
    tmp_path, monkeypatch
):
    write_shards(_model(), 2, tmp_path)
    real = tp_shards.atomic_write_bytes
    calls = []

    def failing(path, data):
        calls.append(path)
        if len(calls) == 3:
            raise OSError("disk full (simulated)")
        return real(path, data)

    monkeypatch.setattr(tp_shards, "atomic_write_bytes", failing)
    with pytest.raises(OSError, match="disk full"):
        write_shards(_model(hidden=16, ffn=32), 2, tmp_path)
    # no staging folder, no temporary file, and the old shards are intact and valid
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fc1_0.bin",
        "fc1_1.bin",
        "fc2_0.bin",
        "fc2_1.bin",
        MANIFEST,
    ]
    assert torch.equal(
        load_shard(tmp_path, 2, 1, hidden_size=32).fc1.weight, _model().fc1.weight[32:]
    )
