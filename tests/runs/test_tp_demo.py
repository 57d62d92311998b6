"""The command line: native mode in a subprocess, torchrun ranks through the launcher."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.core.errors import LaunchError
from helpers.runs.tp_ffn.results import NativeRun, TPRun
from helpers.torchrun.launcher import run_module
from helpers.tp_demo import config_of, main, parser

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SMALL = ["--hidden_size", "64", "--ffn_size", "256", "--seq_len", "16", "--batch_size", "2"]
SMALL += ["--device", "cpu", "--iters", "5", "--warmup", "1"]


def _cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "helpers.tp_demo", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_flags_and_defaults_are_the_sources():
    d = parser().parse_args([])
    assert (d.hidden_size, d.ffn_size, d.seq_len, d.batch_size, d.world_size, d.device) == (
        512,
        1024,
        512,
        8,
        4,
        "cuda",
    )
    assert d.dtype == "float16" and d.iters == 32 and d.warmup == 4 and d.seed == 1


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """One native run for 2 ranks, in a folder of its own (its cwd): the process's output,
    its JSON result, the shard folder and the flags; the launch below reads the shards."""
    tmp_path = tmp_path_factory.mktemp("native")
    shards = tmp_path / "shards2"
    out = tmp_path / "native.json"
    args = [*SMALL, "--world_size", "2", "--shard_dir", str(shards)]
    run = _cli(*args, "--json", str(out), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    return run, json.loads(out.read_text()), shards, args


def test_native_mode_prints_the_sources_lines_and_writes_the_shards(native):
    run, result, shards, _ = native
    tmp_path = shards.parent
    lines = run.stdout.splitlines()
    assert lines[0].startswith("Namespace(hidden_size=64, ffn_size=256")
    native = next(
        x for x in lines if x.startswith("[INFO] native: shape:torch.Size([2, 16, 64]),sum:")
    )
    assert ",mean:" in native and ",min:" in native and ",max:" in native
    assert any(
        x.startswith("[INFO] tp_simulate: shape:torch.Size([2, 16, 64]),sum:") for x in lines
    )
    assert lines[-1].startswith("[INFO] check: max |tp_simulate - native| = ")
    assert lines[-1].endswith("OK")
    assert sorted(p.name for p in shards.iterdir()) == sorted(
        [f"fc{i}_{r}.bin" for i in (1, 2) for r in range(2)] + ["manifest.json"]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["native.json", "shards2"]  # not the cwd
    native = NativeRun.from_dict(result)  # the typed result, as JSON
    assert native.simulate.ok and native.simulate.what == "tp_simulate"
    assert len(native.timing.times) == 4 and native.dtype == "float16"
    assert native.shape == (2, 16, 64)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--ffn_size", "100", "--world_size", "3"],
            "ffn_size=100 is not divisible by world_size=3",
        ),
        (["--world_size", "0"], "world_size=0; valid: an integer >= 1"),
        (["--device", "tpu"], "unknown device 'tpu'; valid choices here: cpu"),
        (["--device", "cuda"], "'cuda' needs a CUDA GPU but this machine has none"),
        (["--dtype", "half"], "unknown dtype 'half'; valid choices: float32, float16, bfloat16"),
        (["--iters", "4", "--warmup", "4"], "valid: 0 <= warmup < iters"),
    ],
)
def test_bad_options_are_named_and_nothing_is_written(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["--device", "cpu", "--shard_dir", str(tmp_path / "s"), *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_tp_mode_without_torchrun_says_how_to_launch(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main([*SMALL, "--mode", "tp", "--shard_dir", str(tmp_path)]) == 1
    assert (
        "torchrun --nproc-per-node=2 -m helpers.runs.tp_ffn.worker"
        in capsys.readouterr().err
    )


@pytest.mark.torchrun
@pytest.mark.slow
def test_two_gloo_ranks_match_native(native, tmp_path):
    _, result, _, args = native
    tp = TPRun.from_dict(
        run_module("helpers.tp_demo", args, nproc=2, timeout=240, log_dir=tmp_path / "logs"))
    native = NativeRun.from_dict(result)
    assert tp.world_size == 2 and tp.backend == "gloo" and tp.shape == native.shape
    assert native.sums_match(tp.checksum), (native, tp.checksum)
    assert tp.agrees(native) and tp.output.max_diff <= tp.output.tolerance
    assert len(tp.step.times) == len(tp.compute.times) == len(tp.allreduce.times) == 4
    assert tp.ring_bytes == 2 * 16 * 64 * 2  # 2(p-1)/p = 1 of 2x16x64 fp16
    assert [w.rank for w in tp.wire] == [0, 1] and tp.wire_ok
    log = next((tmp_path / "logs").glob("**/attempt_*/0/stdout.log")).read_text()
    assert "Namespace(hidden_size=64, ffn_size=256" in log
    assert "[INFO] backend: gloo on the CPU" in log
    assert "[INFO] tp: shape:torch.Size([2, 16, 64]),sum:" in log
    assert "[INFO] check: max |tp - native| = " in log and "OK" in log
    for rank in (0, 1):  # every rank ended through run_worker: nothing after its last line
        err = next((tmp_path / "logs").glob(f"**/attempt_*/{rank}/stderr.log")).read_text()
        assert "terminate called" not in err, err


@pytest.mark.torchrun
@pytest.mark.slow
def test_missing_shards_fail_with_the_ranks_message(tmp_path):
    args = [*SMALL, "--world_size", "2", "--shard_dir", str(tmp_path / "nothing")]
    with pytest.raises(LaunchError, match="failed") as info:
        run_module("helpers.tp_demo", args, nproc=2, timeout=240, log_dir=tmp_path / "logs")
    assert "manifest.json is missing" in info.value.log_tail


def test_the_flags_make_the_workers_config():
    ns = parser().parse_args([*SMALL, "--world_size", "2", "--dtype", "float32"])
    config = config_of(ns)
    assert (config.hidden_size, config.ffn_size, config.seq_len, config.batch_size) == (
        64, 256, 16, 2)
    assert (config.device, config.dtype, config.iters, config.warmup) == ("cpu", "float32", 5, 1)
    assert not config.sweep and not config.train_step  # the source's forward only


def test_the_command_line_ends_through_run_worker(tmp_path):
    """A bad flag leaves through ``run_worker`` too, with argparse's code (``--help``, code 0:
    tests/runs/test_contract.py::test_every_entry_point_help_lists_its_flags[helpers.tp_demo])."""
    bad = _cli("--world_size", "0", "--device", "cpu", cwd=tmp_path)
    assert bad.returncode == 2 and "world_size=0; valid: an integer >= 1" in bad.stderr
