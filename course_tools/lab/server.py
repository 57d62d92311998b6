"""JupyterLab as ``make lab`` starts it, headless, on a folder: started, waited for, stopped.

The course's settings (``docs/lab/overrides.json``) are installed where JupyterLab reads
its application overrides, exactly as ``make lab`` does; the user's own settings and
workspaces are replaced by empty temporary folders, so that nothing a learner changed
alters what is checked, and nothing checked is left in their lab.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from course_tools.lab import LabError
from helpers.core.paths import REPO_ROOT
from helpers.torchrun.launcher import free_port, kill_group

OVERRIDES = REPO_ROOT / "docs" / "lab" / "overrides.json"
LANDING = "/lab/tree/notebooks"  # where `make lab` opens: the lessons' folder


def install_overrides(prefix: Path | None = None) -> Path:
    """Copy the course's JupyterLab settings into ``<prefix>/share/jupyter/lab/settings``
    (the environment's application overrides); return where."""
    target = Path(prefix or sys.prefix) / "share" / "jupyter" / "lab" / "settings"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(OVERRIDES, target / "overrides.json")
    return target / "overrides.json"


def lab_command(root: Path, port: int, token: str) -> list[str]:
    """The ``jupyter lab`` command line of ``make lab``, headless, on ``root``."""
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={port}", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={root}", f"--LabApp.default_url={LANDING}"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        command.append("--allow-root")
    return command


@dataclass(frozen=True)
class Lab:
    """A running JupyterLab: its address and the token that opens it."""

    base: str
    token: str
    log: Path

    def url(self, path: str) -> str:
        """``path`` on this server, with the token."""
        joiner = "&" if "?" in path else "?"
        return f"{self.base}{path}{joiner}token={self.token}"


@contextmanager
def jupyter_lab(root: Path, timeout: float = 60.0) -> Iterator[Lab]:
    """JupyterLab serving ``root`` until the block ends; its whole process group then."""
    install_overrides()
    token, port = secrets.token_hex(16), free_port()
    with tempfile.TemporaryDirectory(prefix="lab-user-") as user:
        env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=f"{user}/settings",
                   JUPYTERLAB_WORKSPACES_DIR=f"{user}/workspaces", JUPYTER_NO_CONFIG="1")
        log = Path(user) / "server.log"
        with open(log, "w") as out:
            server = subprocess.Popen(lab_command(root, port, token), stdout=out,
                                      stderr=subprocess.STDOUT, env=env, start_new_session=True)
        lab = Lab(f"http://127.0.0.1:{port}", token, log)
        try:
            _wait_until_up(lab, server, timeout)
            yield lab
        finally:
            _shut_down_kernels(lab)
            kill_group(server, grace=10.0)  # its process group, SIGKILL what is left


def _wait_until_up(lab: Lab, server: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise LabError(f"JupyterLab exited with {server.returncode}:\n"
                           + lab.log.read_text(errors="replace")[-2000:])
        try:
            with urllib.request.urlopen(lab.url("/api/status"), timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise LabError(f"JupyterLab did not answer within {timeout:g} s:\n"
                   + lab.log.read_text(errors="replace")[-2000:])


def _shut_down_kernels(lab: Lab) -> None:
    """Ask the server to shut down every kernel it started (they run in sessions of their
    own, outside the server's process group)."""
    try:
        with urllib.request.urlopen(lab.url("/api/kernels"), timeout=5) as answer:
            kernels = json.load(answer)
        for kernel in kernels:
            request = urllib.request.Request(lab.url(f"/api/kernels/{kernel['id']}"),
                                             method="DELETE")
            urllib.request.urlopen(request, timeout=30).close()
    except OSError:  # the server is gone already: its kernels went with its shutdown
        pass
