"""A live line saying what a launch is doing while a cell waits for it.

Shown while the ranks run, then removed: "<module>: 8 ranks running, 12 s; rank 0: <the last
line rank 0 printed>". In Jupyter it is one output line updated in place; in a terminal, a
line on stderr rewritten with a carriage return. Stored runs (``make run``, ``make
refresh``, the tests: ``TUTORIAL_PROGRESS=final``) show nothing, so what nbval compares
does not change.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from helpers.core.text import WIDTH
from helpers.core.timing import PROGRESS_ENV
from helpers.torchrun.ranks import Rank


def say(rank: Rank | int, line: str) -> None:
    """Rank 0 of a launch prints ``line`` at once (flushed): while the cell waits, the live
    line shows the last line rank 0 printed. Other ranks say nothing."""
    if (rank if isinstance(rank, int) else rank.rank) == 0:
        print(line, flush=True)


def last_line(path: Path | None) -> str:
    """The last non-empty line of a log file ("" when there is none yet)."""
    if path is None or not path.is_file():
        return ""
    with open(path, "rb") as log:
        log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
        lines = [b.strip() for b in log.read().splitlines() if b.strip()]
    return lines[-1].decode(errors="replace") if lines else ""


def status_line(module: str, nproc: int, seconds: float, rank0: str) -> str:
    """The line shown, cut to :data:`WIDTH` characters."""
    name = ".".join(module.split(".")[-2:])  # e.g. llama_3d.suite: room for rank 0's line
    line = f"{name}: {nproc} rank(s) running, {seconds:.0f} s" + (
        f"; rank 0: {rank0}" if rank0 else "")
    return line if len(line) <= WIDTH else line[:WIDTH - 1] + "…"


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    try:
        return shell is not None and type(shell.get_ipython()).__name__ == "ZMQInteractiveShell"
    except AttributeError:
        return False


class LaunchStatus:
    """``update()`` while a launch runs, ``close()`` when it ends (the line disappears)."""

    def __init__(self, module: str, nproc: int, interval: float = 1.0) -> None:
        self.module, self.nproc, self.interval = module, nproc, interval
        self.enabled = os.environ.get(PROGRESS_ENV) != "final"
        self.start, self._shown, self._handle = time.monotonic(), 0.0, None

    def update(self, rank0_log: Path | None) -> None:
        """Show the line again if ``interval`` seconds have passed since it was last shown."""
        now = time.monotonic()
        if not self.enabled or now - self._shown < self.interval:
            return
        self._shown = now
        line = status_line(self.module, self.nproc, now - self.start, last_line(rank0_log))
        if _in_notebook():
            from IPython.display import display

            if self._handle is None:
                self._handle = display({"text/plain": line}, raw=True, display_id=True)
            else:
                self._handle.update({"text/plain": line}, raw=True)
        else:
            sys.stderr.write("\r" + line.ljust(WIDTH))
            sys.stderr.flush()

    def close(self) -> None:
        """Remove the line."""
        if self._handle is not None:
            self._handle.update({"text/plain": ""}, raw=True)
        elif self.enabled and self._shown:
            sys.stderr.write("\r" + " " * WIDTH + "\r")
            sys.stderr.flush()
