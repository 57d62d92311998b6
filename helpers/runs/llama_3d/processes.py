"""What outlives a launch: the lesson checks that nothing does after a rank was killed.

(It reads ``helpers.torchrun.launcher.last_group``, the process group the launcher
started its latest launch in; it lives here, beside the lesson that asks, since the
launcher is shared.)
"""

from __future__ import annotations

from pathlib import Path

from helpers.torchrun import launcher


def survivors() -> list[int]:
    """The processes of the latest launch still running: those in its process group (the
    launcher starts each launch in a group of its own). Linux's /proc; empty elsewhere."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if launcher.last_group is not None and int(fields[2]) == launcher.last_group:
            found.append(int(entry.name))  # fields: state, ppid, pgrp, ...
    return found
