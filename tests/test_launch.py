"""The launcher: results from rank 0, a crashing rank named, a hang killed, no orphans."""

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from helpers.launch import LaunchError, check_port, free_port, launch

HERE = Path(__file__).resolve().parent
ENV = {"PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _probe_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "launch_probe" in line and "ps -eo" not in line]


def test_result_comes_from_rank_0(tmp_path):
    result = launch("launch_probe", ["ok"], nproc=2, timeout=120, env=ENV, log_dir=tmp_path)
    assert result["sum"] == 3.0 and result["world"] == 2 and result["backend"] == "gloo"
    assert (tmp_path / "launcher.log").exists()


def test_crashing_rank_is_named_with_its_log_tail(tmp_path):
    with pytest.raises(LaunchError, match="on rank 1") as info:
        launch("launch_probe", ["crash"], nproc=2, timeout=120, env=ENV, log_dir=tmp_path)
    assert info.value.rank == 1
    assert "rank 1 exploded on purpose" in info.value.log_tail
    assert not _probe_processes()


def test_timeout_kills_every_rank(tmp_path):
    start = time.monotonic()
    with pytest.raises(LaunchError, match="did not finish within 10 s; every rank was killed"):
        launch("launch_probe", ["hang"], nproc=2, timeout=10, env=ENV, log_dir=tmp_path)
    assert time.monotonic() - start < 40
    time.sleep(0.5)
    assert not _probe_processes()


def test_ports_are_free_picked_and_taken_ports_refused():
    port = free_port()
    assert check_port(port) == port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {taken} is already in use"):
            launch("launch_probe", ["ok"], nproc=1, port=taken, env=ENV)
    with pytest.raises(ValueError, match="out of range"):
        check_port(70000)
