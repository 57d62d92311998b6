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
    chunk_file_bytes,
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


def _shards(tmp_path):
    torch.manual_seed(1)
    model = FeedForward(16, 64)
    write_shards(model, 2, tmp_path)
    return model


def test_chunk_bytes_are_float32_whatever_the_dtype():
    t = torch.tensor([[1.5, -2.0]], dtype=torch.bfloat16)
    assert chunk_file_bytes(t) == np.array([[1.5, -2.0]], dtype="<f4").tobytes()


def test_manifest_records_each_files_tensor_rank_and_split(tmp_path):
    _shards(tmp_path)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest["byte_order"] == "little" and manifest["order"] == "C"
    entry = {k: v for k, v in manifest["files"]["fc2_1.bin"].items() if k != "sha256"}
    assert entry == {
        "tensor": "fc2.weight",
        "rank": 1,
        "split_dim": 1,
        "shape": [16, 32],
        "bytes": 2048,
    }
    assert manifest["files"]["fc1_0.bin"]["split_dim"] == 0


def test_shard_manifest_without_a_field_or_of_another_format(tmp_path):
    _shards(tmp_path)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    del manifest["ffn_size"]
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(
        ShardError,
        match=r"^manifest\.json is not a shard manifest of format 'tp-ffn-shards/1' "
        r"\(missing: ffn_size\); rewrite the shards$",
    ):
        load_shard(tmp_path, 2, 0)
    del manifest["hidden_size"]
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"\(missing: hidden_size, ffn_size\); rewrite"):
        load_shard(tmp_path, 2, 0)
    manifest["hidden_size"], manifest["ffn_size"], manifest["format"] = 16, 64, "other/1"
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"\(missing: none\); rewrite the shards$"):
        load_shard(tmp_path, 2, 0)
    (tmp_path / MANIFEST).unlink()
    with pytest.raises(
        ShardError,
        match=r"write the shards first \(write_shards, or `python -m helpers\.tp_demo "
        r"--world_size N --shard_dir DIR` in native mode\)$",
    ):
        load_shard(tmp_path, 2, 0)


def test_a_manifest_entry_that_disagrees_with_the_sizes_is_refused(tmp_path):
    _shards(tmp_path)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    manifest["files"]["fc1_0.bin"]["bytes"] = 4095
    manifest["files"].pop("fc2_0.bin")
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(
        ShardError,
        match=r"^manifest\.json describes fc1_0\.bin as \[32, 16\] \(4095 bytes\) but the sizes it "
        r"records need 2048 bytes = float32 32x16; rewrite the shards$",
    ):
        load_shard(tmp_path, 2, 0)
    manifest["files"]["fc1_0.bin"]["bytes"] = 2048
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"describes fc2_0\.bin as None \(None bytes\)"):
        load_shard(tmp_path, 2, 0)


def test_loaded_shard_gets_the_activation_asked_for(tmp_path):
    model = _shards(tmp_path)
    shard = load_shard(tmp_path, 2, 1, activation="gelu")
    assert isinstance(shard.act, nn.GELU)
    assert torch.equal(shard.fc1.weight, model.fc1.weight[32:])


def test_describe_shards_table(tmp_path):
    folder = tmp_path / "shards"
    _shards(folder)
    (folder / "fc2_1.bin").unlink()
    lines = describe_shards(folder).splitlines()
    assert lines[:2] == [
        "shards: world size 2, hidden 16, ffn 64, float32 little-endian, C order",
        "file       tensor      split shape            bytes  sha256",
    ]
    assert len(lines) == 6 and lines[2].startswith(
        "fc1_0.bin  fc1.weight  dim 0 32x16             2048  "
    )
    assert lines[2].endswith("...") and len(lines[2].rsplit("  ", 1)[1]) == 16 + 3
