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


def _children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (read from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_a_launch_ends_when_its_launching_process_is_killed_hard(tmp_path):
    """SIGKILL the process that called ``launch`` mid-launch (as a crashed kernel would die):
    the torchrun agent and both ranks (one of them hanging) must end too."""
    import signal
    import time

    pids = tmp_path / "pids"
    pids.mkdir()
    script = (
        "from helpers.distributed.launcher import launch\n"
        f"launch('launch_probe', ['hang'], nproc=2, timeout=600, log_dir={str(tmp_path / 'logs')!r},"
        f" env={{'PYTHONPATH': {str(HERE)!r}, 'PROBE_PID_DIR': {str(pids)!r}}})\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while len(list(pids.glob("*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        ranks = [int(p.read_text()) for p in pids.glob("*.pid")]
        assert len(ranks) == 2, "the ranks never started"
        agents = _children(parent.pid)
        assert agents, "no torchrun agent under the launching process"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 20
        while any(_running(p) for p in agents + ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in agents + ranks if _running(p)], "processes outlived their launcher"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_die_with_parent_says_when_it_cannot(monkeypatch):
    from helpers.distributed import lifeline

    monkeypatch.setattr(lifeline.sys, "platform", "darwin")
    assert lifeline.die_with_parent() is False
