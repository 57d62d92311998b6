"""Lesson 06: backend planning, the launched sweep, and PyTorch's own tensor parallelism."""

from dataclasses import replace

import pytest

from helpers import distributed
from helpers.launch import LaunchError
from helpers.paths import RESULTS_DIR
from helpers.tp_demo import DemoConfig
from helpers.tp_runs import plan_device, run_2d, run_dtensor, run_tp, tp_sweep

TINY = DemoConfig(
    hidden_size=32,
    ffn_size=64,
    seq_len=8,
    batch_size=2,
    world_size=2,
    device="cpu",
    dtype="float32",
    iters=3,
    warmup=1,
    shard_dir=None,
)


def _fake_gpus(monkeypatch, n):
    monkeypatch.setattr(distributed.torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(distributed.torch.cuda, "device_count", lambda: n)


def test_plan_uses_gpus_only_with_one_per_rank(monkeypatch):
    assert plan_device([1, 2, 4])[:2] == ("cpu", "float32")
    _fake_gpus(monkeypatch, 4)
    assert plan_device([1, 2, 4])[:2] == ("cuda", "float16")
    _fake_gpus(monkeypatch, 1)
    device, _, reason = plan_device([1, 2, 4])
    assert device == "cpu" and "Duplicate GPU detected" in reason


def test_nccl_with_too_few_gpus_is_refused_before_launch(monkeypatch):
    _fake_gpus(monkeypatch, 1)
    with pytest.raises(ValueError, match=r"world size 2 but 1 GPU\(s\).*valid: world size <= 1"):
        distributed.choose_backend(2, "nccl")
    with pytest.raises(ValueError, match="unknown backend 'mpi'"):
        distributed.choose_backend(2, "mpi")


def test_sweep_checksums_match_native():
    sweep = tp_sweep(TINY, (1, 2))
    assert [r["world_size"] for r in sweep["rows"]] == [1, 2]
    for row in sweep["rows"]:
        assert row["checksum_agrees"] and row["backend"] == "gloo"
        assert row["checksum_diff"] <= row["checksum_tolerance"]
        assert row["tp_s"] > 0 and row["allreduce_s"] >= 0
    assert sweep["native"]["tp_simulate_agrees"]


def test_parallelize_module_matches_the_shard_files():
    tp_sweep(TINY, (2,))  # writes the shards
    result = run_dtensor(TINY, 2)
    assert result["local_shards_equal_files"]
    assert result["fc1_placement"] == "S(0)" and result["fc2_placement"] == "S(1)"
    assert result["fc1_local_shape"] == [32, 32] and result["fc2_local_shape"] == [32, 32]
    assert result["max_diff_vs_hand_tp"] <= 1e-5


def test_missing_shards_fail_with_the_rank_log():
    with pytest.raises(LaunchError) as info:
        run_tp(replace(TINY, shard_dir=str(RESULTS_DIR / "no_such_shards_test")), 2)
    assert "manifest.json is missing" in info.value.log_tail


def test_two_dimensional_mesh_step_equals_full_model():
    """dp=2 x tp=2: each rank's output rows and updated shards match one device."""
    config = replace(TINY, batch_size=4, world_size=4)
    result = run_2d(config, 4, 2)
    assert (result["dp"], result["tp"], result["mesh"]) == (2, 2, "[[0, 1], [2, 3]]")
    assert result["output_diff"] <= 1e-5 and result["weight_diff"] <= 1e-5
