"""The launcher's waiting and killing to the letter: the poll interval and the deadline of
``_wait`` and the log it shows, the signals and grace of ``kill_group``, how long
``_group_gone`` looks, the defaults ``run_module`` passes on, what a launch hands to
torchrun and to its status line, a Stop's message either way, and a success's logs removed."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.core.errors import LaunchStopped
from helpers.torchrun import launcher
from helpers.torchrun.ranks import RESULT_ENV


class Clock:
    """A stand-in for the launcher's ``time``: ``sleep`` records and moves the clock."""

    def __init__(self, now: float, step: float = 0.0) -> None:
        self.now, self.step, self.slept = now, step, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += self.step


class FakeProc:
    """A stand-in process: each ``wait`` records its timeout, sets the clock, then times out
    or returns an exit code, as scripted."""

    pid = 4242

    def __init__(self, outcomes, clock: Clock | None = None, calls: list | None = None) -> None:
        self.outcomes, self.clock = list(outcomes), clock
        self.calls = [] if calls is None else calls

    def wait(self, timeout=None):
        self.calls.append(("wait", timeout))
        at, result = self.outcomes.pop(0)
        if at is not None and self.clock is not None:
            self.clock.now = at
        if result == "timeout":
            raise subprocess.TimeoutExpired("stand-in", timeout)
        return result


class Status:
    """A stand-in LaunchStatus recording what it is shown."""

    def __init__(self) -> None:
        self.shown, self.closed = [], 0

    def update(self, path):
        self.shown.append(path)

    def close(self):
        self.closed += 1


def test_wait_polls_every_half_second_and_shows_the_newest_rank_0_stdout(tmp_path, monkeypatch):
    """Half-second polls; between them the status shows rank 0's stdout of the newest attempt
    (not its stderr, not rank 1's, not an older attempt's)."""
    for attempt, rank, name in [(0, 0, "stdout"), (1, 0, "stderr"), (1, 0, "stdout"),
                                (1, 1, "stdout"), (2, 1, "stdout")]:
        folder = tmp_path / "run" / f"attempt_{attempt}" / str(rank)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.log").write_text("x")
    clock = Clock(100.0)
    monkeypatch.setattr(launcher, "time", clock)
    proc = FakeProc([(100.5, "timeout"), (101.0, "timeout"), (None, 7)], clock)
    status = Status()
    assert launcher._wait(proc, 10.0, status, tmp_path) == 7
    assert proc.calls == [("wait", 0.5)] * 3
    newest = tmp_path / "run" / "attempt_1" / "0" / "stdout.log"
    assert status.shown == [newest, newest] and status.closed == 1


def test_wait_without_a_stdout_log_shows_none(tmp_path, monkeypatch):
    """Only a stderr log so far: the status is updated with no log."""
    folder = tmp_path / "run" / "attempt_0" / "0"
    folder.mkdir(parents=True)
    (folder / "stderr.log").write_text("x")
    clock = Clock(0.0)
    monkeypatch.setattr(launcher, "time", clock)
    status = Status()
    assert launcher._wait(FakeProc([(0.5, "timeout"), (None, 0)], clock), 5.0, status,
                          tmp_path) == 0
    assert status.shown == [None] and status.closed == 1


def test_wait_shortens_its_last_poll_and_gives_up_at_the_deadline(tmp_path, monkeypatch):
    """Timeout 0.2 s: the first poll lasts 0.2 s, one 5 ms short of the deadline 10 ms (the
    floor); reaching the deadline exactly raises, and the status line is closed."""
    clock = Clock(100.0)
    monkeypatch.setattr(launcher, "time", clock)
    deadline = 100.0 + 0.2
    proc = FakeProc([(deadline - 0.005, "timeout"), (deadline, "timeout"), (None, 0)], clock)
    status = Status()
    with pytest.raises(subprocess.TimeoutExpired):
        launcher._wait(proc, 0.2, status, tmp_path)
    assert [c[0] for c in proc.calls] == ["wait", "wait"]
    assert proc.calls[0][1] == pytest.approx(0.2) and proc.calls[1][1] == pytest.approx(0.01)
    assert status.shown == [None] and status.closed == 1


@pytest.fixture
def killpg(monkeypatch):
    """``os.killpg`` recorded into a shared list; ``fail`` maps a call number to an error."""
    calls, fail = [], {}

    def fake(pid, sig):
        calls.append(("killpg", pid, sig))
        error = fail.get(len(calls))
        if error is not None:
            raise error

    monkeypatch.setattr(os, "killpg", fake)
    return calls, fail


def test_kill_group_terms_waits_five_seconds_then_kills_what_is_left(killpg):
    """A launcher that ends on SIGTERM: one SIGKILL for its workers, then done."""
    calls, _ = killpg
    launcher.kill_group(FakeProc([(None, 0)], calls=calls))
    assert calls == [("killpg", 4242, signal.SIGTERM), ("wait", 5.0),
                     ("killpg", 4242, signal.SIGKILL)]


def test_kill_group_escalates_once_when_sigterm_is_ignored(killpg):
    """Deaf to SIGTERM for its grace: SIGKILL, one wait, nothing more."""
    calls, _ = killpg
    launcher.kill_group(FakeProc([(None, "timeout"), (None, -9)], calls=calls), grace=0.3)
    assert calls == [("killpg", 4242, signal.SIGTERM), ("wait", 0.3),
                     ("killpg", 4242, signal.SIGKILL), ("wait", 0.3)]


def test_kill_group_of_a_finished_launch_only_asks(killpg):
    calls, fail = killpg
    fail[1] = ProcessLookupError()
    launcher.kill_group(FakeProc([], calls=calls))
    assert calls == [("killpg", 4242, signal.SIGTERM)]


def test_group_gone_probes_for_two_seconds_every_50_ms(killpg, monkeypatch):
    """A group that stays: probed with signal 0 at 0, 0.5, ..., 2.0 and 2.5 s (a clock moving
    0.5 s a sleep), so 5 sleeps of 0.05 s; the deadline itself is not yet past."""
    calls, _ = killpg
    clock = Clock(50.0, step=0.5)
    monkeypatch.setattr(launcher, "time", clock)
    assert launcher._group_gone(FakeProc([])) is False
    assert calls == [("killpg", 4242, 0)] * 6
    assert clock.slept == [0.05] * 5


def test_group_gone_when_the_group_disappears_and_not_when_forbidden(killpg, monkeypatch):
    calls, fail = killpg
    clock = Clock(0.0, step=0.01)
    monkeypatch.setattr(launcher, "time", clock)
    fail[3] = ProcessLookupError()
    assert launcher._group_gone(FakeProc([]), wait=1.0) is True
    assert len(calls) == 3 and clock.slept == [0.05, 0.05]
    calls.clear()
    fail.clear()
    fail[1] = PermissionError()
    assert launcher._group_gone(FakeProc([])) is False
    assert calls == [("killpg", 4242, 0)]


def test_run_module_passes_its_defaults_and_restarts_on(monkeypatch):
    """timeout 300 s, 1 thread a rank, no restarts unless asked, a picked port."""
    seen = []
    monkeypatch.setattr(launcher, "free_port", lambda: 40123)
    monkeypatch.setattr(launcher, "_launch_once", lambda *a: seen.append(a) or {"ok": 1})
    assert launcher.run_module("m", nproc=2) == {"ok": 1}
    assert launcher.run_module("m", ["--a"], nproc=1, restarts=2, timeout=5.0) == {"ok": 1}
    assert seen == [("m", (), 2, 300.0, 1, 40123, None, None, 0),
                    ("m", ["--a"], 1, 5.0, 1, 40123, None, None, 2)]


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """Launch ``python -c script module nproc restarts`` instead of torchrun."""

    def use(script: str):
        def command(module, args, *, nproc, port, log_dir, restarts=0):
            return [sys.executable, "-c", script, module, str(nproc), str(restarts), *args]

        monkeypatch.setattr(launcher, "torchrun_command", command)

    monkeypatch.setenv(launcher.LOG_DIR_ENV, str(tmp_path / "launches"))
    return use


@pytest.fixture
def recorded(monkeypatch):
    """The launcher's ``_wait``, ``kill_group`` and ``_group_gone``, recorded, still run."""
    calls = []
    wait, kill, gone = launcher._wait, launcher.kill_group, launcher._group_gone

    def rec_wait(proc, timeout, status, log_dir):
        calls.append(("wait", proc.pid, timeout, status.module, status.nproc, log_dir))
        return wait(proc, timeout, status, log_dir)

    def rec_kill(proc, **kwargs):
        calls.append(("kill", proc.pid, kwargs))
        return kill(proc, **kwargs)

    def rec_gone(proc, **kwargs):
        calls.append(("gone", proc.pid, kwargs))
        return gone(proc, **kwargs)

    monkeypatch.setattr(launcher, "_wait", rec_wait)
    monkeypatch.setattr(launcher, "kill_group", rec_kill)
    monkeypatch.setattr(launcher, "_group_gone", rec_gone)
    return calls


REPORT = (
    "import ctypes, json, os, sys\n"
    "sig = ctypes.c_int(-1)\n"
    "ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG\n"
    "result = {'argv': sys.argv[1:], 'pid': os.getpid(), 'pdeathsig': sig.value}\n"
    f"open(os.environ['{RESULT_ENV}'], 'w').write(json.dumps(result))\n"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_a_launch_hands_on_restarts_dies_with_us_and_is_the_last_group(
    stand_in, recorded, tmp_path
):
    """The restarts reach torchrun's command; the agent gets SIGKILL when this process dies;
    its pid is ``last_group``; it is waited for with its module, ranks, timeout and log
    folder, then its group is killed with a 1 s grace."""
    stand_in(REPORT)
    logs = tmp_path / "logs"
    result = launcher.run_module("pkg.worker", ["--x"], nproc=3, timeout=60.0, restarts=2,
                                 log_dir=logs)
    assert result["argv"] == ["pkg.worker", "3", "2", "--x"]
    assert result["pdeathsig"] == signal.SIGKILL
    pid = result["pid"]
    assert launcher.last_group == pid
    assert recorded == [("wait", pid, 60.0, "pkg.worker", 3, logs),
                        ("kill", pid, {"grace": 1.0})]


@pytest.mark.parametrize("gone", [True, False])
def test_a_stop_ends_the_ranks_and_says_what_is_left(stand_in, recorded, tmp_path, monkeypatch,
                                                     gone):
    """Stop (a KeyboardInterrupt while waiting): the group is killed with a 1 s grace, then
    the message says whether anything of the group is left, and where the logs are."""
    stand_in("import time; time.sleep(30)")

    def interrupted(proc, timeout, status, log_dir):
        recorded.append(("wait", proc.pid))
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "_wait", interrupted)
    if not gone:
        monkeypatch.setattr(launcher, "_group_gone",
                            lambda proc: recorded.append(("gone", proc.pid, {})) or False)
    with pytest.raises(LaunchStopped) as stopped:
        launcher.run_module("pkg.worker", nproc=2, log_dir=tmp_path / "logs")
    pid = recorded[0][1]
    assert recorded[1:] == [("kill", pid, {"grace": 1.0}),
                            ("gone", pid, {}),
                            ("kill", pid, {"grace": 1.0})]
    left = ("nothing it started is left running" if gone else
            f"its process group {pid} may still hold processes (kill -- -{pid})")
    assert str(stopped.value) == (f"pkg.worker stopped: its 2 rank(s) were ended and {left}; "
                                  "logs in logs")


def test_read_result_removes_its_logs_even_if_already_gone(tmp_path):
    """A success removes the launch's log folder; one already removed is no error."""
    result_file = tmp_path / "result.json"
    result_file.write_text(json.dumps({"loss": 1.5}))
    logs = tmp_path / "logs"
    (logs / "run").mkdir(parents=True)
    assert launcher.read_result("m", result_file, logs, True) == {"loss": 1.5}
    assert not logs.exists()
    assert launcher.read_result("m", result_file, logs, True) == {"loss": 1.5}
    assert launcher.read_result("m", result_file, Path(tmp_path / "kept"), False) == {"loss": 1.5}
