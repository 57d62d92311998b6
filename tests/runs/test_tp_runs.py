"""The torchrun lesson's launches: one per worker, each doing everything its lesson asks
(the tensor-parallel worker's: every world size in one launch)."""

import sys
import threading
from contextlib import contextmanager
from dataclasses import astuple, replace

import pytest
import torch

from helpers.comm.collectives import run_collective
from helpers.comm.wire import WireMeter, wire_unavailable
from helpers.profiles import get_profile
from helpers.runs import contract
from helpers.runs.contract import launch, serve
from helpers.runs.tp_ffn import worker
from helpers.runs.tp_ffn.config import MeshConfig, TPFFNConfig
from helpers.runs.tp_ffn.results import MeshRun, SweepRun, TPRun
from helpers.runs.tp_ffn.shard_files import write_all_shards
from helpers.runs.tp_ffn.wire import (
    NCCL_REASON,
    WireCheck,
    predict,
)
from helpers.torchrun.in_notebook import run_ranks
from helpers.torchrun.ranks import Rank

SMOKE = get_profile("smoke")
# the smoke profile's FFN (hidden 32, ffn 64, seq 8, batch 2; 3 iterations, 1 untimed)
TINY = TPFFNConfig.for_profile(SMOKE, device="cpu", dtype="float32")


@pytest.mark.twin
@pytest.mark.torchrun
def test_one_sweep_launch_runs_every_world_size_on_its_first_ranks():
    """4 ranks: native on rank 0, then p = 1, 2, 4, each on ranks 0..p-1 (a group of their own):
    output and sum, one SGD step through f and g, the wide size; parallelize_module on p = 4."""
    config = replace(TINY, sweep=(1, 2, 4), train_step=True, activation="gelu", dtensor=True,
                     wide=astuple(SMOKE.ffn))
    write_all_shards(config, (1, 2, 4))
    sweep = launch(config)  # max(sweep) ranks
    assert isinstance(sweep, SweepRun)
    assert sweep.ok and list(sweep.runs) == [1, 2, 4] and sweep.work_s > 0
    native = sweep.native
    assert native.simulate.ok and native.shape == (2, 8, 32)
    assert len(native.timing.times) == TINY.iters - TINY.warmup
    out_bytes = 2 * 8 * 32 * 4  # the output, float32
    for p, run in sweep.runs.items():
        # the group's own size: the ring's bytes and the ledger's 1/p come from it
        assert (run.world_size, run.backend) == (p, "gloo") and run.agrees(native)
        assert run.output.ok and 0 <= run.output.tolerance < 1e-4
        assert run.ring_bytes == 2 * (p - 1) / p * out_bytes
        # every rank's sockets: gloo's ring payload (the ring's bytes) plus its headers
        assert len(run.wire) == p and run.wire_ok
        assert all(w.sent is None or w.sent == run.ring_bytes + w.headers for w in run.wire)
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


@pytest.mark.torchrun
def test_one_run_on_every_rank_returns_its_own_result(tmp_path):
    """No sweep: the launch's ranks are the world size; the shards may be in one folder."""
    config = replace(TINY, shard_dir=str(tmp_path / "shards"), train_step=True)
    write_all_shards(config, (2,))
    run = launch(config, nproc=2)
    assert isinstance(run, TPRun) and (run.world_size, run.backend) == (2, "gloo")
    assert run.output.ok and run.train_step.ok and run.dtensor is None and run.wide is None


def test_a_sweep_is_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="a sweep reads each world size's shards from its own"):
        launch(replace(TINY, shard_dir="one/folder", sweep=(1, 2)))
    with pytest.raises(ValueError, match="distinct integers >= 1"):
        launch(replace(TINY, sweep=(2, 2)))
    with pytest.raises(ValueError, match="ffn_size=64 is not divisible by world_size=3"):
        launch(replace(TINY, sweep=(1, 3)))
    with pytest.raises(ValueError, match=r"the largest world size is every rank of the launch"):
        launch(replace(TINY, sweep=(1, 2)), nproc=4)
    with pytest.raises(ValueError, match="needs nproc"):
        launch(TINY)  # one run: the ranks are the caller's choice


@contextmanager
def _one_of_two_ranks(*args, **kwargs):
    yield Rank(0, 2, 0, torch.device("cpu"), "gloo", "a stand-in for torchrun's rank 0")


def test_the_worker_names_a_bad_sweep_in_one_line(capsys, monkeypatch):
    """``serve`` validates on every rank before any step: the worker's module, then why."""
    monkeypatch.setattr(contract, "process_group", _one_of_two_ranks)
    monkeypatch.setattr(contract, "exit_worker", lambda code: sys.exit(code))
    with pytest.raises(SystemExit) as exited:
        serve(TPFFNConfig, worker.main, [*TINY.args(), "--shard-dir", "x", "--sweep", "1,2"])
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "helpers.runs.tp_ffn.worker: error: shard_dir='x' is one folder"), err


@pytest.mark.twin
@pytest.mark.torchrun
def test_two_dimensional_mesh_step_equals_full_model():
    """dp=2 x tp=2: each rank's output rows and updated shards match one device."""
    config = MeshConfig.for_profile(SMOKE, device="cpu", dtype="float32", batch_size=4, dp=2)
    result = launch(config, nproc=4)
    assert isinstance(result, MeshRun)
    assert (result.dp, result.tp, result.mesh) == (2, 2, ((0, 1), (2, 3)))
    assert result.ok and all(p.tolerance < 1e-5 for p in result.proofs)


def test_a_mesh_that_does_not_fit_is_refused_before_any_rank_starts():
    config = MeshConfig.for_profile(SMOKE, device="cpu", dtype="float32", dp=4)
    with pytest.raises(ValueError, match="dp=4 must divide the world size 4 and the batch 2"):
        launch(config, nproc=4)


def test_configs_round_trip_through_the_workers_command_line():
    mesh = MeshConfig.for_profile(SMOKE, device="cpu", dtype="float32", dp=4, lr=0.5)
    assert MeshConfig.from_args(mesh.args()) == mesh
    run = replace(TINY, train_step=True, activation="gelu", lr=0.5, dtensor=True,
                  wide=astuple(SMOKE.ffn), sweep=(1, 2))
    assert TPFFNConfig.from_args(run.args()) == run
    assert run.wide_sizes == SMOKE.ffn


def test_an_unknown_activation_is_refused():
    with pytest.raises(ValueError, match="activation='relu'; valid: none, gelu"):
        replace(TINY, activation="relu").validate(2)
    with pytest.raises(SystemExit):
        TPFFNConfig.from_args(["--activation", "relu"])  # argparse's own choices


def test_a_wire_check_lies_between_gloos_payload_and_its_headers():
    assert WireCheck(0, 110, 100.0, 10).ok and WireCheck(0, 100, 100.0, 10).ok
    assert not WireCheck(0, 111, 100.0, 10).ok and not WireCheck(0, 99, 100.0, 10).ok
    assert WireCheck(0, None, 100.0, 10, NCCL_REASON).ok  # nothing read, nothing judged


@pytest.mark.skipif(wire_unavailable() is not None, reason=str(wire_unavailable()))
@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather"])
def test_thread_ranks_put_gloos_payload_and_headers_on_the_wire(collective):
    """Two thread ranks, one window around one call: both ranks' bytes, exactly."""
    meter, size = WireMeter(within_process=True), 64 * 1024
    opened = threading.Barrier(2, action=meter.__enter__)
    closed = threading.Barrier(2, action=lambda: meter.__exit__(None, None, None))

    def work(rank, group):
        full = torch.ones(size // 4)
        opened.wait()
        run_collective(collective, full, rank, 2, group=group)
        closed.wait()

    assert run_ranks(2, work, timeout=30) == [None, None]
    expected = predict([(collective, size)], 2, 0)
    assert meter.sent == 2 * (expected[0] + expected[1])


def test_break_it_runs_the_workers_proof_and_catches_each_mistake():
    """Lesson 08's "Break it": two thread ranks on the real shard files, the worker's check."""
    from helpers.runs.tp_ffn.break_it import broken_run

    write_all_shards(TINY, (2,))
    right = broken_run(TINY, "none")
    assert right.ok and right.proofs[0].tolerance < 1e-5
    for mistake in ("wrong file", "no all-reduce"):
        verdict = broken_run(TINY, mistake)
        assert not verdict.ok and verdict.line().startswith("✗ 2 ranks = native")
        assert verdict.worst.max_diff > 1000 * verdict.worst.tolerance  # far beyond rounding
    with pytest.raises(ValueError, match="mistake='typo'; valid: 'none', 'wrong file'"):
        broken_run(TINY, "typo")
    with pytest.raises(ValueError, match="world_size=1; valid: 2 or more"):
        broken_run(TINY, "none", world_size=1)
