"""nbval really guards the lessons: a changed stored output makes it fail, and nothing else\ndoes (not the caller's profile, its GPU, its cores, nor rounding)."""

import json
import os
import re
import shutil
import subprocess
import sys
from configparser import ConfigParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"
# a lesson in miniature, stored as a small-profile CPU run stores it: the profile and the
# device it runs on, then a proof's verdict twice, each with a difference this machine's
# rounding may print otherwise (stored: 9.9e-17; the sanitizer hides it); the second
# verdict's stored word is tampered with
VERDICT = ("diff = abs(0.1 + 0.2 - 0.3)\n"
           "print(f\"sum max |diff| = {diff:.1e} (tolerance 1e-15): "
           "{'OK' if diff <= 1e-15 else 'FAILED'}\")",
           "sum max |diff| = 9.9e-17 (tolerance 1e-15): OK\n")
CELLS = [
    ("from helpers.profiles import get_profile\nprint(get_profile().name)", "small\n"),
    ("import torch\nprint(torch.cuda.device_count())", "0\n"),
    VERDICT,
    (VERDICT[0], VERDICT[1].replace("OK", "FAILED")),
]
TAMPERED = len(CELLS) - 1


def _notebook() -> dict:
    """The miniature lesson with its stored outputs."""
    cells = [{"cell_type": "code", "execution_count": i + 1, "id": f"cell-{i}", "metadata": {},
              "source": source, "outputs": [
                  {"name": "stdout", "output_type": "stream", "text": text}]}
             for i, (source, text) in enumerate(CELLS)]
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3",
            "display_name": "Python 3", "language": "python"}}, "nbformat": 4,
            "nbformat_minor": 5}


def _run_nbval(folder: Path, notebook: str) -> subprocess.CompletedProcess:
    """nbval on ``notebook`` as make test runs it (conftest.py and the sanitizer copied
    beside it), on one CPU core with TUTORIAL_PROFILE=full and a GPU asked for."""
    shutil.copy(SANITIZE, folder)
    shutil.copy(ROOT / "conftest.py", folder)
    cmd = [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
           "--nbval-sanitize-with", SANITIZE.name, "-p", "no:cacheprovider", "-o", "addopts=",
           "--rootdir", str(folder), "-rf", notebook]  # fmt: skip
    env = {**os.environ, "TUTORIAL_PROFILE": "full", "CUDA_VISIBLE_DEVICES": "0"}
    return subprocess.run(
        cmd, capture_output=True, text=True, cwd=folder, env=env, timeout=600,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
    )  # fmt: skip


@pytest.mark.slow  # a subprocess that runs a notebook under nbval
def test_only_a_tampered_output_fails_on_one_core_in_a_foreign_env(tmp_path):
    """The miniature lesson under nbval: conftest forces the stored outputs' profile and
    the CPU (the caller asked for the full profile and a GPU), the sanitizer hides the
    rounding; every cell passes but the one whose stored verdict was changed, which nbval
    reports."""
    (tmp_path / "lesson.ipynb").write_text(json.dumps(_notebook()))
    result = _run_nbval(tmp_path, "lesson.ipynb")
    summary = re.search(r"(\d+) failed, (\d+) passed", result.stdout)
    assert result.returncode != 0 and summary, result.stdout[-3000:]
    assert (int(summary[1]), int(summary[2])) == (1, len(CELLS) - 1), result.stdout[-3000:]
    assert f"FAILED lesson.ipynb::Cell {TAMPERED}" in result.stdout, result.stdout[-3000:]


def test_sanitizer_hides_rounding_not_verdicts():
    cfg = ConfigParser()
    cfg.read(SANITIZE, encoding="utf-8")
    text = "loss max |diff| ≈ 3.1e-07   OK (tolerance 1e-05) at 0x7f3a2b1c4d50"
    for section in cfg.sections():
        text = re.sub(cfg[section]["regex"], cfg[section]["replace"], text)
    assert text == "loss max |diff| ≈ VALUE   OK (tolerance 1e-05) at 0xADDRESS"
