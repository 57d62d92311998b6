"""The live line a launch shows while a cell waits: what it says, and that stored runs
never see it."""

from __future__ import annotations

from helpers.core.timing import PROGRESS_ENV
from helpers.torchrun import status


def test_the_line_names_the_launch_and_rank_0s_last_words_within_the_width(tmp_path):
    log = tmp_path / "stdout.log"
    assert status.last_line(log) == "" and status.last_line(None) == ""
    log.write_bytes(b"step 1\nstep 2 \xff\n\n")
    assert status.last_line(log) == "step 2 \ufffd"
    line = status.status_line("helpers.runs.x.worker", 8, 12.4, "layout 3 of 9")
    assert line == "x.worker: 8 rank(s) running, 12 s; rank 0: layout 3 of 9"
    long = status.status_line("m", 2, 1.0, "x" * 300)
    assert len(long) == status.WIDTH and long.endswith("…")
    assert status.status_line("m", 2, 1.0, "") == "m: 2 rank(s) running, 1 s"


def test_a_terminal_sees_the_line_rewritten_then_erased(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    log = tmp_path / "stdout.log"
    log.write_text("warming up\n")
    shown = status.LaunchStatus("m", 2, interval=0.0)
    shown.update(log)
    shown.close()
    err = capsys.readouterr().err
    assert err.startswith("\rm: 2 rank(s) running, 0 s; rank 0: warming up")
    assert err.endswith("\r" + " " * status.WIDTH + "\r")


def test_stored_runs_show_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(PROGRESS_ENV, "final")
    quiet = status.LaunchStatus("m", 2, interval=0.0)
    quiet.update(None)
    quiet.close()
    assert capsys.readouterr() == ("", "")
