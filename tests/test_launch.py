"""The launcher: results from rank 0, the failing rank named, a hang killed, no orphans."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from helpers.core.errors import LaunchError
from helpers.distributed import launcher
from helpers.distributed.launcher import check_port, free_port, launch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@pytest.fixture
def probe(tmp_path):
    """Launch the probe with its logs and pid files under this test's temporary folder."""
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {
        "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "PROBE_PID_DIR": str(pids),
    }

    def run(mode, nproc=2, **kwargs):
        kwargs.setdefault("log_dir", tmp_path / "logs")
        return launch("launch_probe", [mode], nproc=nproc, env=env, **kwargs)

    run.pids = pids
    return run


def alive(pid_dir: Path) -> list[int]:
    """The probe processes of this test that still run (zombies count as ended)."""
    living = []
    for f in pid_dir.glob("*.pid"):
        stat = Path(f"/proc/{f.read_text()}/stat")
        if stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z":
            living.append(int(f.read_text()))
    return living


def test_result_comes_from_rank_0(probe, tmp_path):
    result = probe("ok", timeout=120)
    assert result["sum"] == 3.0 and result["world"] == 2 and result["backend"] == "gloo"
    assert (tmp_path / "logs" / "launcher.log").exists()
    assert len(list(probe.pids.glob("*.pid"))) == 2 and not alive(probe.pids)


def test_cross_rank_maximum_reports_the_rank_that_disagrees(probe):
    assert probe("disagree", nproc=3, timeout=120)["max_over_ranks"] == 20.0


def test_crashing_rank_is_named_with_its_log_tail(probe):
    with pytest.raises(LaunchError, match="on rank 1") as info:
        probe("crash", timeout=120)
    assert info.value.rank == 1
    assert "rank 1 exploded on purpose" in info.value.log_tail
    assert not alive(probe.pids)


def test_two_failing_ranks_report_the_root_cause():
    """torchrun's own summary lists every failure; the first observed one is the cause."""
    first, later = (
        ProcessFailure(local_rank=r, pid=100 + r, exitcode=1, error_file="/nonexistent")
        for r in (1, 0)
    )
    first.timestamp, later.timestamp = 1_000, 1_005
    summary = ChildFailedError("probe", {0: later, 1: first}).format_msg()
    assert summary.index("rank      : 0") < summary.index("Root Cause")  # listed first ...
    assert launcher.root_cause(summary) == (1, 1)  # ... but rank 1 failed first
    assert launcher.root_cause("no summary at all") == (None, None)


def test_timeout_kills_every_rank(probe):
    with pytest.raises(LaunchError, match="did not finish within 10 s; every rank was killed"):
        probe("hang", timeout=10)
    assert len(list(probe.pids.glob("*.pid"))) == 2
    assert not alive(probe.pids)


def test_ports_are_free_picked_and_taken_ports_refused(probe):
    port = free_port()
    assert check_port(port) == port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {taken} is already in use"):
            probe("ok", nproc=1, port=taken)
    with pytest.raises(ValueError, match="out of range"):
        check_port(70000)
    with pytest.raises(ValueError, match="nproc=0"):
        probe("ok", nproc=0)


def test_a_port_taken_after_it_was_picked_is_picked_again(probe, monkeypatch):
    """The race between picking a free port and torchrun binding it: retried, not failed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        picks = iter([taken])
        real = launcher.free_port
        monkeypatch.setattr(launcher, "free_port", lambda: next(picks, None) or real())
        monkeypatch.setattr(launcher, "check_port", lambda p: p)  # as if it was free when picked
        assert probe("ok", nproc=1, timeout=120)["sum"] == 1.0


@pytest.mark.parametrize(
    "module",
    [
        "helpers.tensor_parallel.ffn_worker",
        "helpers.tensor_parallel.dtensor_worker",
        "helpers.tensor_parallel.mesh_worker",
    ],
)
def test_a_worker_started_without_torchrun_says_how_to_launch_it(module):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    run = subprocess.run(
        [sys.executable, "-m", module, "--device", "cpu"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert f"launch it with `torchrun --nproc-per-node=2 -m {module}" in lines[0]
