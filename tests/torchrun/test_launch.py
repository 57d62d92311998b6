"""The launcher: results from rank 0, the failing rank named, a hang killed, no orphans."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from helpers.core.errors import LaunchError
from helpers.torchrun import launcher
from helpers.torchrun.launcher import free_port, run_module, validate_port
from helpers.torchrun.ranks import RESULT_ENV

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _probe(folder: Path):
    """Launch the probe with its logs and pid files under ``folder``."""
    pids = folder / "pids"
    pids.mkdir()
    env = {
        "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "PROBE_PID_DIR": str(pids),
    }

    def run(mode, nproc=2, **kwargs):
        kwargs.setdefault("log_dir", folder / "logs")
        return run_module("launch_probe", [mode], nproc=nproc, env=env, **kwargs)

    run.pids, run.logs = pids, folder / "logs"
    return run


@pytest.fixture
def probe(tmp_path):
    """Launch the probe with its logs and pid files under this test's temporary folder."""
    return _probe(tmp_path)


@pytest.fixture(scope="module")
def retried_crash(tmp_path_factory):
    """One launch read by two tests. Its first port is taken after it was picked (the race
    between picking a free port and torchrun binding it), so it is picked again; on the
    retry rank 0 writes the all-reduce's result, then rank 1 raises while rank 0 waits in
    the next all-reduce. The probe's runner and the launch's error."""
    probe = _probe(tmp_path_factory.mktemp("retried_crash"))
    with socket.socket() as s, pytest.MonkeyPatch.context() as patch:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        picks = iter([taken])
        real = launcher.free_port
        patch.setattr(launcher, "free_port", lambda: next(picks, None) or real())
        patch.setattr(launcher, "validate_port", lambda p: p)  # as if it was free when picked
        with pytest.raises(LaunchError) as info:
            probe("crash", timeout=120)
        assert next(picks, None) is None  # the taken port was tried
    return probe, info.value


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie counts as ended)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def alive(pid_dir: Path) -> list[int]:
    """The probe processes of this test that still run."""
    return [pid for f in pid_dir.glob("*.pid") if _running(pid := int(f.read_text()))]


def test_cross_rank_maximum_reports_the_rank_that_disagrees():
    """max_over_ranks on three real gloo ranks (threads of this process, as in the
    exercises): every rank gets the largest value, that of the rank that disagrees."""
    import torch

    from helpers.torchrun.in_notebook import run_ranks
    from helpers.torchrun.ranks import Rank, max_over_ranks

    def work(r: int, group: object) -> float:
        rank = Rank(rank=r, world_size=3, local_rank=r, device=torch.device("cpu"),
                    backend="gloo", reason="threads", group=group)
        return max_over_ranks(10.0 * r, rank)

    assert run_ranks(3, work) == [20.0, 20.0, 20.0]


@pytest.mark.torchrun
def test_crashing_rank_is_named_with_its_log_tail(retried_crash):
    probe, error = retried_crash
    assert "on rank 1" in str(error) and error.rank == 1, str(error)
    assert "rank 1 exploded on purpose" in error.log_tail
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


@pytest.mark.torchrun
def test_timeout_kills_every_rank(probe):
    with pytest.raises(LaunchError, match="did not finish within 10 s; every rank was killed"):
        probe("hang", timeout=10)
    assert len(list(probe.pids.glob("*.pid"))) == 2
    assert not alive(probe.pids)


def test_ports_are_free_picked_and_taken_ports_refused(probe):
    port = free_port()
    assert validate_port(port) == port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {taken} is already in use"):
            probe("ok", nproc=1, port=taken)
    with pytest.raises(ValueError, match="out of range"):
        validate_port(70000)
    with pytest.raises(ValueError, match="nproc=0"):
        probe("ok", nproc=0)


@pytest.mark.torchrun
def test_a_port_taken_after_it_was_picked_is_picked_again(retried_crash):
    """The race between picking a free port and torchrun binding it: retried, not failed
    (the error is the retry's rank 1, not the clash); the retry's result comes from rank 0,
    its log is kept, and no rank outlives it. That run_module returns the result of a
    retry: test_launch_retries_a_picked_port_taken_meanwhile_but_nothing_else."""
    probe, error = retried_crash
    assert error.rank == 1 and not error.port_clash, str(error)
    result = json.loads((probe.logs / "result.json").read_text())
    assert result["sum"] == 3.0 and result["world"] == 2 and result["backend"] == "gloo"
    assert (probe.logs / "launcher.log").exists()
    assert len(list(probe.pids.glob("*.pid"))) == 2 and not alive(probe.pids)


@pytest.mark.slow  # a subprocess importing torch: the whole path, exit code included
def test_a_worker_started_without_torchrun_says_how_to_launch_it():
    module = "helpers.runs.tp_ffn.worker"
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    run = subprocess.run(
        [sys.executable, "-m", module, "--device", "cpu"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert f"launch it with `torchrun --nproc-per-node=2 -m {module}" in lines[0]


@pytest.mark.parametrize("module", ["helpers.runs.tp_ffn.mesh_worker",
                                    "helpers.runs.schedules.worker"])
def test_every_worker_started_without_torchrun_says_how_to_launch_it(module, monkeypatch, capsys):
    """The other workers' main, in this process: the same one line, exit code 1."""
    import importlib

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    worker = importlib.import_module(module)
    argv = {"helpers.runs.tp_ffn.mesh_worker": ["--device", "cpu"],
            "helpers.runs.schedules.worker": ["--schedules", "gpipe", "--microbatches", "4",
                                                  "--batch", "32"]}[module]
    # each worker starts through serve, whose exit (os._exit) is made a SystemExit here
    config = worker.MeshConfig if module.endswith("mesh_worker") else worker.SchedulesConfig
    monkeypatch.setattr("helpers.runs.contract.exit_worker", lambda c: sys.exit(c))
    with pytest.raises(SystemExit) as exited:
        worker.serve(config, worker.main, argv)
    code = exited.value.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(lines) == 1, lines
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


@pytest.mark.torchrun
@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_a_launch_ends_when_its_launching_process_is_killed_hard(tmp_path):
    """SIGKILL the process that called ``run_module`` mid-launch (as a crashed kernel would die):
    the torchrun agent and both ranks (one of them hanging) must end too."""
    import signal
    import time

    pids = tmp_path / "pids"
    pids.mkdir()
    script = (
        "from helpers.torchrun.launcher import run_module\n"
        f"run_module('launch_probe', ['hang'], nproc=2, timeout=600, log_dir={str(tmp_path / 'logs')!r},"
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
    from helpers.torchrun import lifeline

    monkeypatch.setattr(lifeline.sys, "platform", "darwin")
    assert lifeline.die_with_parent() is False


def test_failing_rank_is_read_after_the_root_cause():
    log = "rank : 0\nRoot Cause (first observed failure):\n  rank      : 12 (local_rank: 3)"
    assert launcher.root_cause(log) == (12, 3)
    assert launcher.root_cause("Root Cause\nrank: 2\nRoot Cause\nrank: 3") == (2, 2)
    assert launcher.root_cause("error: rank : 1 failed") == (1, 1)
    assert launcher.root_cause("[E] rank : 0 failed\nRoot Cause\n rank : 4") == (4, 4)
    assert launcher.root_cause("Root Cause: nothing here") == (None, None)


def test_torchrun_command_line(tmp_path):
    assert launcher.torchrun_command("pkg.mod", ["--a", "1"], nproc=3, port=29511, log_dir=tmp_path) == [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=3",
        "--master-addr=127.0.0.1", "--master-port=29511", "--max-restarts=0",
        "--monitor-interval=0.2", f"--log-dir={tmp_path}", "--redirects=3", "-m", "pkg.mod",
        "--a", "1",
    ]  # fmt: skip


def test_logs_with_undecodable_bytes_are_still_read(tmp_path):
    log = tmp_path / "launcher.log"
    log.write_bytes(b"worker said \xff\xfe\nEADDRINUSE\n")
    assert launcher._port_clash(log)
    assert launcher.tail(log) == "worker said \ufffd\ufffd\nEADDRINUSE"


def test_port_clash_is_read_from_the_launcher_log(tmp_path):
    log = tmp_path / "launcher.log"
    assert not launcher._port_clash(log)  # no log at all
    for text, clash in (
        ("ok", False),
        ("bind: Address already in use", True),
        ("EADDRINUSE", True),
    ):
        log.write_text(f"line\n{text}\nline")
        assert launcher._port_clash(log) is clash


def test_ports_in_range_free_or_taken():
    port = launcher.free_port()
    assert 1024 <= port <= 65535 and launcher.validate_port(port) == port
    for bad in (0, 65536):
        with pytest.raises(ValueError, match=rf"^port {bad} is out of range; valid: 1\.\.65535"):
            launcher.validate_port(bad)
    for edge in (1, 65535):  # in range: either free or in use, never "out of range"
        try:
            assert launcher.validate_port(edge) == edge
        except LaunchError:
            pass
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(
            LaunchError, match=rf"^port {taken} is already in use \(.+\); pass port=None"
        ):
            launcher.validate_port(taken)


def test_rank_logs_and_their_tails(tmp_path):
    rank0 = tmp_path / "run" / "attempt_0" / "0"
    rank0.mkdir(parents=True)
    (rank0 / "stdout.log").write_text("\n".join(f"out {i}" for i in range(30)))
    (rank0 / "stderr.log").write_text("err")
    (rank0 / "other.txt").write_text("not a log")
    assert launcher.rank_logs(tmp_path, 0) == [rank0 / "stderr.log", rank0 / "stdout.log"]
    assert launcher.rank_logs(tmp_path, 1) == []
    assert launcher.tail(tmp_path / "missing.log") == ""
    assert launcher.tail(rank0 / "stdout.log", 2) == "out 28\nout 29"
    assert launcher.tail(rank0 / "stdout.log").splitlines()[0] == "out 5"  # 25 lines by default
    assert (
        launcher.rank_tail(tmp_path, 0, 1)
        == "--- rank 0 stderr.log ---\nerr\n--- rank 0 stdout.log ---\nout 29"
    )
    assert launcher.rank_tail(tmp_path, 3) == "(no log files for rank 3)"


def _started(script: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    return proc, proc.stdout.readline().strip()


DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(10)"


def test_kill_group_escalates_to_sigkill_and_takes_the_workers_down():
    stubborn, _ = _started(DEAF)
    launcher.kill_group(stubborn, grace=0.2)
    assert stubborn.returncode == -signal.SIGKILL
    stubborn.stdout.close()
    parent, worker = _started(
        "import subprocess, sys, time\n"
        f"w = subprocess.Popen([sys.executable, '-c', {DEAF!r}], stdout=subprocess.PIPE)\n"
        "w.stdout.readline(); print(w.pid, flush=True); time.sleep(10)"
    )
    launcher.kill_group(parent, grace=5.0)
    assert parent.returncode == -signal.SIGTERM  # the launcher ended on SIGTERM ...
    deadline = time.time() + 5
    while _running(int(worker)) and time.time() < deadline:
        time.sleep(0.02)
    assert not _running(int(worker))  # ... and its worker, deaf to SIGTERM, was killed
    parent.stdout.close()
    launcher.kill_group(parent)  # already gone: nothing to do, no error


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """Launch ``python -c script module nproc port log_dir args...`` instead of torchrun."""

    def use(script: str):
        def command(module, args, *, nproc, port, log_dir, restarts=0):
            return [
                sys.executable,
                "-c",
                script,
                module,
                str(nproc),
                str(port),
                str(log_dir),
                *args,
            ]

        monkeypatch.setattr(launcher, "torchrun_command", command)

    monkeypatch.setenv(launcher.LOG_DIR_ENV, str(tmp_path / "launches"))
    return use


REPORT = (
    "import json, os, sys\n"
    "keys = ('OMP_NUM_THREADS', 'PYTHONUNBUFFERED', 'GUARD_EXTRA', 'GUARD_PARENT')\n"
    "result = {'argv': sys.argv[1:], 'env': {k: os.environ.get(k) for k in keys}}\n"
    f"open(os.environ['{RESULT_ENV}'], 'w').write(json.dumps(result))\n"
)


def test_launch_returns_rank_0s_result_and_sets_the_environment(stand_in, tmp_path, monkeypatch):
    stand_in(REPORT)
    monkeypatch.setenv("GUARD_PARENT", "inherited")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    logs = tmp_path / "logs"
    (logs).mkdir()
    (logs / "result.json").write_text('{"stale": true}')
    port = launcher.free_port()
    env = {"GUARD_EXTRA": "given", "OMP_NUM_THREADS": "9"}
    result = launcher.run_module(
        "pkg.worker", ["--x", "1"], nproc=3, threads_per_rank=2, port=port, log_dir=logs, env=env
    )
    assert result["argv"] == ["pkg.worker", "3", str(port), str(logs), "--x", "1"]
    assert result["env"] == {
        "OMP_NUM_THREADS": "2",
        "PYTHONUNBUFFERED": "1",
        "GUARD_EXTRA": "given",
        "GUARD_PARENT": "inherited",
    }
    assert sorted(p.name for p in logs.iterdir()) == ["launcher.log", "result.json"]  # kept


def test_a_launch_in_its_own_log_folder_leaves_nothing_after_success(
    stand_in, tmp_path, monkeypatch
):
    stand_in(REPORT)
    result = launcher.run_module("pkg.sub.worker", nproc=1)
    used = Path(result["argv"][3])
    assert used.parent == tmp_path / "launches"
    assert used.name.startswith("worker-") and used.name[7:15].isdigit() and used.name[15] == "-"
    assert result["env"]["OMP_NUM_THREADS"] == "1" and not used.exists()
    again = Path(launcher.run_module("worker", nproc=1)["argv"][3])  # same base folder, no package
    assert again.parent == used.parent and again.name.startswith("worker-")
    monkeypatch.delenv(launcher.LOG_DIR_ENV)  # the default: results/logs
    monkeypatch.setattr(launcher, "results_path", lambda name: tmp_path / "results" / name)
    used = Path(launcher.run_module("pkg.mod", nproc=1)["argv"][3])
    assert used.parent == tmp_path / "results" / "logs" and used.name.startswith("mod-")
    assert list(used.parent.iterdir()) == []


def test_a_failed_launch_names_the_root_cause_rank_and_shows_its_log(stand_in, tmp_path):
    stand_in(
        "import sys; from pathlib import Path\n"
        "d = Path(sys.argv[4]) / 'run' / 'attempt_0' / '1'; d.mkdir(parents=True)\n"
        "(d / 'stderr.log').write_text('\\n'.join(f'line {i}' for i in range(40)))\n"
        "sys.stdout.buffer.write(b'worker bytes \\xff\\xfe\\n'); sys.stdout.flush()\n"
        "print('rank : 0 is fine\\nRoot Cause (first observed failure):\\n  rank : 5 (local_rank: 1)',"
        " file=sys.stderr)\n"  # torchrun reports the root cause on stderr
        "sys.exit(3)\n"
    )
    with pytest.raises(LaunchError) as error:
        launcher.run_module("pkg.worker", nproc=2, log_dir=tmp_path / "deep" / "logs")
    assert str(error.value).startswith("pkg.worker failed (exit code 3) on rank 5; logs in logs\n")
    assert error.value.rank == 5 and not error.value.port_clash  # its log is local rank 1's
    assert error.value.log_tail.splitlines()[:2] == ["--- rank 1 stderr.log ---", "line 15"]
    # then the other ranks' logs: one killed while its peer failed may not show its error
    assert error.value.log_tail.endswith("line 39\n(no log files for rank 0)")
    assert (tmp_path / "deep" / "logs" / "launcher.log").exists()  # a failure keeps its logs


def test_an_unknown_failing_rank_and_a_port_clash(stand_in, tmp_path):
    stand_in("import sys; print('bind failed: EADDRINUSE'); sys.exit(1)")
    with pytest.raises(LaunchError) as error:
        launcher.run_module("pkg.worker", nproc=2, port=launcher.free_port(), log_dir=tmp_path / "l")
    assert "failed (exit code 1) on rank ?; logs in l\n(no log files for rank 0)" in str(
        error.value
    )
    assert error.value.rank is None and error.value.port_clash
    assert error.value.log_tail == "(no log files for rank 0)\n(no log files for rank 1)"


def test_a_launch_that_writes_no_result_is_an_error(stand_in, tmp_path):
    stand_in("pass")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "result.json").write_text("{}")  # from an earlier run: must not be returned
    with pytest.raises(
        LaunchError, match=r"^pkg\.worker finished but rank 0 wrote no result; logs in logs$"
    ):
        launcher.run_module("pkg.worker", nproc=1, log_dir=logs)


@pytest.fixture
def started(monkeypatch):
    """The launcher's processes, recorded as it starts them."""
    seen = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self)

    monkeypatch.setattr(launcher.subprocess, "Popen", Recorded)
    return seen


def test_a_hung_launch_is_killed_at_its_timeout(stand_in, tmp_path, started):
    stand_in("import time; time.sleep(10)")
    rank0 = tmp_path / "logs" / "r" / "attempt_0" / "0"
    rank0.mkdir(parents=True)
    (rank0 / "stdout.log").write_text("\n".join(f"step {i}" for i in range(20)))
    start = time.time()
    with pytest.raises(LaunchError) as error:
        launcher.run_module("pkg.worker", nproc=2, timeout=0.5, log_dir=tmp_path / "logs")
    assert time.time() - start < 10
    try:
        assert started[0].poll() == -signal.SIGTERM  # its whole process group was ended
    finally:
        started[0].kill()
    message = str(error.value)
    assert message.startswith(
        "pkg.worker with 2 rank(s) did not finish within 0.5 s; every rank was killed. Logs in logs\n"
    )
    assert error.value.log_tail == (
        "--- rank 0 stdout.log ---\n"
        + "\n".join(f"step {i}" for i in range(10, 20))
        + "\n(no log files for rank 1)"
    )


def test_launch_retries_a_picked_port_taken_meanwhile_but_nothing_else(monkeypatch):
    ports, attempts = iter(range(40001, 40010)), []
    monkeypatch.setattr(launcher, "free_port", lambda: next(ports))
    monkeypatch.setattr(launcher, "validate_port", lambda port: port)

    def once_failing(outcomes):
        outcomes = iter(outcomes)

        def once(module, args, nproc, timeout, threads, port, log_dir, env, restarts):
            attempts.append(port)
            outcome = next(outcomes)
            if outcome == "ok":
                return {"port": port}
            error = LaunchError(outcome)
            error.port_clash = outcome == "clash"
            raise error

        monkeypatch.setattr(launcher, "_launch_once", once)

    once_failing(["clash", "clash", "ok"])
    assert launcher.run_module("m", nproc=1) == {"port": 40003} and attempts == [40001, 40002, 40003]
    attempts.clear()
    once_failing(["clash", "clash", "clash", "ok"])
    with pytest.raises(LaunchError, match="clash"):
        launcher.run_module("m", nproc=1)
    assert len(attempts) == 3
    attempts.clear()
    once_failing(["broken", "ok"])
    with pytest.raises(LaunchError, match="broken"):
        launcher.run_module("m", nproc=1)
    assert len(attempts) == 1
    attempts.clear()
    once_failing(["clash", "ok"])
    with pytest.raises(LaunchError, match="clash"):
        launcher.run_module("m", nproc=1, port=29999)  # a port the caller chose is not changed
    assert attempts == [29999]
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match=rf"^nproc={bad!r}; valid: an integer >= 1$"):
            launcher.run_module("m", nproc=bad)


def test_a_stopped_launch_says_its_ranks_were_ended_and_nothing_is_left(stand_in, tmp_path,
                                                                       started):
    import _thread
    import threading

    from helpers.core.errors import LaunchStopped

    stand_in("import time; time.sleep(30)")
    # interrupt_main does nothing where SIGINT is ignored (as in mutmut's fork server)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(1.0, _thread.interrupt_main).start()  # the learner presses Stop
    start = time.time()
    try:
        with pytest.raises(LaunchStopped) as stopped:
            launcher.run_module("pkg.worker", nproc=2, log_dir=tmp_path / "logs")
    finally:
        signal.signal(signal.SIGINT, handler)
    assert time.time() - start < 10 and isinstance(stopped.value, KeyboardInterrupt)
    assert str(stopped.value) == ("pkg.worker stopped: its 2 rank(s) were ended and nothing "
                                  "it started is left running; logs in logs")
    assert stopped.value._render_traceback_() == [f"LaunchStopped: {stopped.value}"]
    with pytest.raises(ProcessLookupError):
        os.killpg(started[0].pid, 0)
