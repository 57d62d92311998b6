"""The torchrun lesson's launches: one per worker, each doing everything its lesson asks
(``ffn_worker``'s: every world size in one launch)."""

from dataclasses import replace

import pytest

from helpers.profiles import get_profile
from helpers.runs.tp_ffn import worker as ffn_worker
from helpers.runs.tp_ffn.config import DemoConfig, RunOptions
from helpers.runs.tp_ffn.launch import launch_mesh, launch_sweep, write_all_shards
from helpers.runs.tp_ffn.mesh_worker import MeshOptions

SMOKE = get_profile("smoke")
# the smoke profile's FFN (hidden 32, ffn 64, seq 8, batch 2; 3 iterations, 1 untimed)
TINY = DemoConfig.from_profile(SMOKE, world_size=2, device="cpu", dtype="float32")


@pytest.mark.torchrun
def test_one_sweep_launch_runs_every_world_size_on_its_first_ranks():
    """4 ranks: native on rank 0, then p = 1, 2, 4, each on ranks 0..p-1 (a group of their own):
    output and sum, one SGD step through f and g, the wide size; parallelize_module on p = 4."""
    config = replace(TINY, world_size=4)
    write_all_shards(config, (1, 2, 4))
    options = RunOptions(train_step=True, activation="gelu", dtensor=True, wide=SMOKE.ffn)
    sweep = launch_sweep(config, (1, 2, 4), options)
    assert sweep.ok and list(sweep.runs) == [1, 2, 4] and sweep.work_s > 0
    native = sweep.native
    assert native.simulate.ok and native.shape == (2, 8, 32)
    assert len(native.timing.times) == TINY.iters - TINY.warmup
    out_bytes = 2 * 8 * 32 * 4  # the output, float32
    for p, run in sweep.runs.items():
        # the group's own size: the ring's bytes and the ledger's 1/p come from it
        assert (run.world_size, run.backend) == (p, "gloo") and run.agrees(native)
        assert run.output.ok and 0 <= run.output.tolerance < 1e-4
        assert run.allreduce_bytes_per_rank == 2 * (p - 1) / p * out_bytes
        assert run.memory.sum().weights == 2 * 32 * 64 * 4 // p  # fc1 and fc2 slices, float32
        step = run.train_step
        assert step.ok and step.activation == "gelu"
        assert [q.what for q in step.proofs] == ["loss", "output", "input_grad", "grads", "weights"]
        assert all(q.tolerance < 1e-4 for q in step.proofs)
        assert run.wide.output.ok and run.wide.sizes == SMOKE.ffn
        assert len(run.wide.step.times) == SMOKE.ffn.iters - SMOKE.ffn.warmup
        assert len(run.step.times) == TINY.iters - TINY.warmup
        assert (run.dtensor is not None) == (p == 4)  # the whole world only
    dt = sweep.runs[4].dtensor
    assert dt.shards_equal_files and dt.ok
    assert dt.local == (("fc1.weight", "S(0)", (16, 32)), ("fc2.weight", "S(1)", (32, 16)))


def test_a_sweep_is_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="a sweep reads each world size's shards from its own"):
        launch_sweep(replace(TINY, shard_dir="one/folder"), (1, 2))
    with pytest.raises(ValueError, match="distinct integers >= 1"):
        launch_sweep(TINY, (2, 2))
    with pytest.raises(ValueError, match="ffn_size=64 is not divisible by world_size=3"):
        launch_sweep(TINY, (1, 3))


def test_the_sweep_worker_names_a_bad_sweep_without_torchrun(capsys):
    assert ffn_worker.main([*TINY.args(), "--shard_dir", "x", "--sweep", "1,2"]) == 1
    assert "ffn_worker: error: --shard_dir x is one folder" in capsys.readouterr().err


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

    from helpers.runs.tp_ffn.config import parser

    ap = RunOptions.add_arguments(argparse.ArgumentParser(parents=[parser()], add_help=False))
    options = RunOptions(train_step=True, activation="gelu", lr=0.5, dtensor=True, wide=SMOKE.ffn)
    assert RunOptions.from_args(ap.parse_args(options.args())) == options
    with pytest.raises(ValueError, match="--activation 'relu'; valid: none, gelu"):
        RunOptions.from_args(ap.parse_args(["--activation", "relu"]))
