"""The torchrun lesson's launches: one per worker, each doing everything its lesson asks."""

from dataclasses import replace

import pytest

from helpers.core.profiles import get_profile
from helpers.tensor_parallel.config import DemoConfig, RunOptions
from helpers.tensor_parallel.mesh_worker import MeshOptions
from helpers.tensor_parallel.runs import launch_mesh, launch_tp, write_all_shards

SMOKE = get_profile("smoke")
# the smoke profile's FFN (hidden 32, ffn 64, seq 8, batch 2; 3 iterations, 1 untimed)
TINY = DemoConfig.from_profile(SMOKE, world_size=2, device="cpu", dtype="float32")


@pytest.mark.torchrun
def test_one_launch_proves_the_output_the_step_dtensor_and_the_wide_size():
    """p=2: output and sum, one SGD step through f and g, parallelize_module, a wider FFN."""
    write_all_shards(TINY, (2,))
    options = RunOptions(train_step=True, activation="gelu", dtensor=True, wide=SMOKE.ffn)
    run = launch_tp(TINY, 2, options)
    assert run.backend == "gloo" and run.output.ok and 0 <= run.output.tolerance < 1e-4
    step = run.train_step
    assert step.ok and step.activation == "gelu"
    assert [p.what for p in step.proofs] == ["loss", "output", "input_grad", "grads", "weights"]
    assert all(p.tolerance < 1e-4 for p in step.proofs)
    assert run.dtensor.shards_equal_files and run.dtensor.ok
    assert run.dtensor.local == (("fc1.weight", "S(0)", (32, 32)), ("fc2.weight", "S(1)", (32, 32)))
    assert run.wide.output.ok and run.wide.sizes == SMOKE.ffn
    assert len(run.wide.step.times) == SMOKE.ffn.iters - SMOKE.ffn.warmup
    assert run.memory.sum().weights == 2 * 32 * 32 * 4  # fc1 and fc2 halves, float32
    assert len(run.step.times) == TINY.iters - TINY.warmup


@pytest.mark.torchrun
def test_two_dimensional_mesh_step_equals_full_model():
    """dp=2 x tp=2: each rank's output rows and updated shards match one device."""
    config = replace(TINY, batch_size=4, world_size=4)
    result = launch_mesh(config, 4, MeshOptions(dp=2))
    assert (result.dp, result.tp, result.mesh) == (2, 2, ((0, 1), (2, 3)))
    assert result.ok and all(p.tolerance < 1e-5 for p in result.proofs)


def test_mesh_options_round_trip_through_the_workers_command_line():
    config = DemoConfig.from_profile(SMOKE, device="cpu", dtype="float32")
    options = MeshOptions(dp=4, lr=0.5)
    assert MeshOptions.from_args(config.args() + options.args()) == (config, options)


def test_run_options_round_trip_and_refuse_an_unknown_activation():
    import argparse

    from helpers.tensor_parallel.config import parser

    ap = RunOptions.add_arguments(argparse.ArgumentParser(parents=[parser()], add_help=False))
    options = RunOptions(train_step=True, activation="gelu", lr=0.5, dtensor=True, wide=SMOKE.ffn)
    assert RunOptions.from_args(ap.parse_args(options.args())) == options
    with pytest.raises(ValueError, match="--activation 'relu'; valid: none, gelu"):
        RunOptions.from_args(ap.parse_args(["--activation", "relu"]))
