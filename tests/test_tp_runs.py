"""The torchrun lesson: the launched sweep, a training step, and PyTorch's own tensor parallelism."""

from dataclasses import replace

import pytest

from helpers.core.errors import LaunchError
from helpers.core.paths import RESULTS_DIR
from helpers.tensor_parallel.config import DemoConfig
from helpers.tensor_parallel.runs import (
    launch_dtensor,
    launch_mesh,
    launch_tp,
    tp_sweep,
    write_all_shards,
)

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


@pytest.mark.torchrun
def test_sweep_checksums_match_native():
    sweep = tp_sweep(TINY, (1, 2))
    assert [r["world_size"] for r in sweep["rows"]] == [1, 2]
    for row in sweep["rows"]:
        assert row["checksum_agrees"] and row["output_agrees"] and row["backend"] == "gloo"
        assert 0 <= row["output_max_diff"] <= row["output_tolerance"] < 1e-4
    assert sweep["native"]["tp_simulate_agrees"]


@pytest.mark.torchrun
def test_parallelize_module_matches_the_shard_files():
    write_all_shards(TINY, (2,))
    result = launch_dtensor(TINY, 2)
    assert result["local_shards_equal_files"]
    assert result["fc1_placement"] == "S(0)" and result["fc2_placement"] == "S(1)"
    assert result["fc1_local_shape"] == [32, 32] and result["fc2_local_shape"] == [32, 32]
    assert result["max_diff_vs_hand_tp"] <= 1e-5


@pytest.mark.torchrun
def test_missing_shards_fail_with_the_rank_log():
    with pytest.raises(LaunchError) as info:
        launch_tp(replace(TINY, shard_dir=str(RESULTS_DIR / "no_such_shards_test")), 2)
    assert "manifest.json is missing" in info.value.log_tail


@pytest.mark.torchrun
def test_two_dimensional_mesh_step_equals_full_model():
    """dp=2 x tp=2: each rank's output rows and updated shards match one device."""
    config = replace(TINY, batch_size=4, world_size=4)
    result = launch_mesh(config, 4, 2)
    assert (result["dp"], result["tp"], result["mesh"]) == (2, 2, "[[0, 1], [2, 3]]")
    assert result["output_diff"] <= 1e-5 and result["weight_diff"] <= 1e-5


@pytest.mark.torchrun
def test_training_step_across_ranks_equals_the_one_process_step():
    """Loss, backward through f and g, SGD: each rank's updated shard is the full model's slice."""
    write_all_shards(TINY, (2,))
    result = launch_tp(TINY, 2, train_step=True, activation="gelu")
    step = result["train_step"]
    assert step["agrees"] and step["activation"] == "gelu"
    for what in ("loss", "output", "input_grad", "grads", "weights"):
        assert step["max_diff"][what] <= step["tolerance"][what] < 1e-4, what
