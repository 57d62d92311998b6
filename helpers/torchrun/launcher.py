"""Launch ``torchrun`` from a notebook or a script, safely.

A notebook cannot host ``torch.distributed`` ranks itself: ``spawn`` needs importable
code, and one hung rank would hang the kernel. So the ranks run as a ``torchrun``
subprocess of a module in ``helpers``; this launcher

- picks a free rendezvous port (or checks the one you give),
- writes one log file per rank (``torchrun --log-dir ... --redirects 3``) under
  results/logs/, kept when a launch fails and removed after a success,
- returns rank 0's JSON result,
- kills the whole process group on timeout, on error and on interrupt,
- ends the job when the launching process itself dies, however it dies
  (``helpers.torchrun.lifeline``), and
- on failure raises an error naming the failing rank, with the tail of its log.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from helpers.core.errors import LaunchError, LaunchStopped
from helpers.core.paths import display_path, results_path
from helpers.torchrun.lifeline import child_of_this_process
from helpers.torchrun.ranks import RESULT_ENV
from helpers.torchrun.status import LaunchStatus

LOG_DIR_ENV = "TUTORIAL_LOG_DIR"  # where launches keep their logs (default: results/logs)
last_group: int | None = None  # the process group of the latest launch (its agent's pid)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def validate_port(port: int) -> int:
    """``port`` if it can be bound on 127.0.0.1, else a clear error."""
    if not 1 <= port <= 65535:
        raise ValueError(
            f"port {port!r} is out of range; valid: 1..65535, or None to pick a free one"
        )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as error:
            raise LaunchError(
                f"port {port} is already in use ({error.strerror}); pass port=None to pick a free one"
            ) from None
    return port


def rank_logs(log_dir: Path, rank: int) -> list[Path]:
    """The stdout/stderr files torchrun wrote for local rank ``rank``."""
    return sorted(log_dir.glob(f"**/attempt_*/{rank}/std*.log"))


def tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a text file ('' if missing)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def rank_tail(log_dir: Path, rank: int, lines: int = 25) -> str:
    """The tails of one rank's log files, each under its file name."""
    parts = [f"--- rank {rank} {p.name} ---\n{tail(p, lines)}" for p in rank_logs(log_dir, rank)]
    return "\n".join(parts) or f"(no log files for rank {rank})"


def root_cause(launcher_log: str) -> tuple[int | None, int | None]:
    """(global rank, local rank) that torchrun reports as the root cause of a failure."""
    cause = launcher_log.split("Root Cause", 1)[-1]
    match = re.search(r"rank\s*:\s*(\d+)(?:\s*\(local_rank:\s*(\d+)\))?", cause)
    if not match:
        return None, None
    rank = int(match.group(1))
    return rank, int(match.group(2)) if match.group(2) else rank


def child_env(result_file: Path, threads_per_rank: int, env: dict[str, str] | None) -> dict:
    """The environment of a launch: the caller's, ``env``, the result file, threads per rank."""
    return {**os.environ, **(env or {}), RESULT_ENV: str(result_file),
            "OMP_NUM_THREADS": str(threads_per_rank), "PYTHONUNBUFFERED": "1"}


def new_log_dir(module: str, log_dir: str | Path | None) -> tuple[Path, bool]:
    """(the launch's log folder, whether it was created here and may be removed on success)."""
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        return Path(log_dir), False
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(os.environ.get(LOG_DIR_ENV) or results_path("logs/x").parent)
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{module.rsplit('.', 1)[-1]}-{stamp}-", dir=base)), True


def kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the launch's process group, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:
            # the launcher is gone; make sure no worker survived it
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return


def _wait(proc: subprocess.Popen, timeout: float, status: LaunchStatus, log_dir: Path) -> int:
    """``proc.wait(timeout)``, showing what the launch is doing meanwhile."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                return proc.wait(timeout=min(0.5, max(deadline - time.monotonic(), 0.01)))
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise
            logs = rank_logs(log_dir, 0)
            # the newest attempt's log: after a restart, the running attempt's
            status.update(next((p for p in reversed(logs) if p.name.startswith("stdout")), None))
    finally:
        status.close()


def _group_gone(proc: subprocess.Popen, wait: float = 2.0) -> bool:
    """Whether no process of the launch's process group is left (waiting up to ``wait`` s
    for the killed ones to be reaped)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def torchrun_command(
    module: str, args: Sequence[str], *, nproc: int, port: int, log_dir: str | Path,
    restarts: int = 0,
) -> list[str]:
    """The ``torchrun`` command line of a one-machine launch, as a list of arguments;
    ``restarts``: how many times torchrun restarts every rank after one fails."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",  # the module behind the `torchrun` command
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        f"--max-restarts={restarts}",
        "--monitor-interval=0.2",
        f"--log-dir={log_dir}",
        "--redirects=3",  # each rank's stdout and stderr to its own file
        "-m",
        module,
        *args,
    ]


def _port_clash(launcher_log: Path) -> bool:
    """True when torchrun failed because its rendezvous port was taken meanwhile."""
    text = launcher_log.read_text(errors="replace") if launcher_log.exists() else ""
    return "Address already in use" in text or "EADDRINUSE" in text


def run_module(
    module: str,
    args: Sequence[str] = (),
    *,
    nproc: int,
    timeout: float = 300.0,
    threads_per_rank: int = 1,
    port: int | None = None,
    log_dir: str | Path | None = None,
    env: dict[str, str] | None = None,
    restarts: int = 0,
) -> dict:
    """Run ``torchrun --nproc-per-node=nproc -m module args`` and return rank 0's JSON.

    With ``port=None`` a free port is picked, and picked again (up to 3 times) when
    another process takes it before torchrun binds it.
    """
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc={nproc!r}; valid: an integer >= 1")
    for attempt in range(3):
        chosen = free_port() if port is None else validate_port(port)
        try:
            return _launch_once(
                module, args, nproc, timeout, threads_per_rank, chosen, log_dir, env, restarts
            )
        except LaunchError as error:
            if port is not None or attempt == 2 or not error.port_clash:
                raise
    raise AssertionError("unreachable")


def _launch_once(module, args, nproc, timeout, threads_per_rank, port, log_dir, env,
                 restarts) -> dict:
    log_dir, created = new_log_dir(module, log_dir)
    result_file = log_dir / "result.json"
    result_file.unlink(missing_ok=True)
    cmd = torchrun_command(module, args, nproc=nproc, port=port, log_dir=log_dir,
                           restarts=restarts)
    launcher_log = log_dir / "launcher.log"
    with open(launcher_log, "w") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(result_file, threads_per_rank, env),
            start_new_session=True,
            preexec_fn=child_of_this_process(),  # the agent dies with us; each rank with it
        )
        global last_group
        last_group = proc.pid
        try:
            code = _wait(proc, timeout, LaunchStatus(module, nproc), log_dir)
        except KeyboardInterrupt:
            kill_group(proc, grace=1.0)
            left = "nothing it started is left running" if _group_gone(proc) else (
                f"its process group {proc.pid} may still hold processes (kill -- -{proc.pid})")
            raise LaunchStopped(f"{module} stopped: its {nproc} rank(s) were ended and {left}; "
                                f"logs in {display_path(log_dir)}") from None
        except subprocess.TimeoutExpired:
            kill_group(proc)
            tails = "\n".join(rank_tail(log_dir, r, 10) for r in range(nproc))
            raise LaunchError(
                f"{module} with {nproc} rank(s) did not finish within {timeout:g} s; "
                f"every rank was killed. Logs in {display_path(log_dir)}\n{tails}",
                log_tail=tails,
            ) from None
        finally:
            kill_group(proc, grace=1.0)  # no-op when finished; kills everything on interrupt
    if code != 0:
        rank, local = root_cause(launcher_log.read_text(errors="replace"))
        first = local if local is not None else 0
        # the root cause's logs first, then the others': a rank killed while its peer failed
        # may not have written its own error yet
        log = "\n".join(rank_tail(log_dir, r) for r in [first, *sorted({*range(nproc)} - {first})])
        error = LaunchError(
            f"{module} failed (exit code {code}) on rank {rank if rank is not None else '?'}; "
            f"logs in {display_path(log_dir)}\n{log}",
            rank=rank,
            log_tail=log,
        )
        error.port_clash = _port_clash(launcher_log)
        raise error
    return read_result(module, result_file, log_dir, created)


def read_result(module: str, result_file: Path, log_dir: Path, remove_logs: bool) -> dict:
    """Rank 0's JSON result; the logs of a successful launch are removed if ours."""
    if not result_file.exists():
        raise LaunchError(
            f"{module} finished but rank 0 wrote no result; logs in {display_path(log_dir)}"
        )
    result = json.loads(result_file.read_text())
    if remove_logs:
        shutil.rmtree(log_dir, ignore_errors=True)  # a success leaves nothing; failures keep logs
    return result
