
"""The stored outputs compare equal on any learner's machine: other cores, builds, env."""

import os
import re
import subprocess
import sys
from configparser import ConfigParser
from pathlib import Path

import pytest

from helpers.core.devices import MachineInfo

ROOT = Path(__file__).resolve().parent.parent
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


def _sanitize(text: str) -> str:
    cfg = ConfigParser()
    cfg.read(SANITIZE, encoding="utf-8")
    for section in cfg.sections():
        text = re.sub(cfg[section]["regex"], cfg[section]["replace"], text)
    return text


def test_machine_lines_of_different_machines_compare_equal():
    laptop = MachineInfo("2.14.1+cpu", None, 0, [], 8, True, False).describe()
    server = MachineInfo("2.14.1+cu130", "13.0", 2, ["NVIDIA H200", "NVIDIA H200"], 64, True, True)
    assert _sanitize(laptop) == _sanitize(server.describe()) == "MACHINE"
    # only the machine line: a verdict on the same line of output stays compared
    assert _sanitize(f"{laptop}\nproof: OK") == "MACHINE\nproof: OK"


@pytest.mark.slow  # a subprocess that starts Python with torch (or a notebook)
def test_a_lesson_passes_nbval_on_one_core_with_a_foreign_environment():
    """One CPU core, TUTORIAL_PROFILE=full and a visible-GPU setting: the same verdicts,
    because conftest.py forces the stored outputs' profile and the CPU."""
    env = {**os.environ, "TUTORIAL_PROFILE": "full", "CUDA_VISIBLE_DEVICES": "0"}
    cmd = [sys.executable, "-m", "pytest", "notebooks/01_toy_model_parallel.ipynb", "-q"]
    run = subprocess.run(
        cmd,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert re.search(r"\d+ passed", run.stdout)
