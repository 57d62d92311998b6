"""nbval really guards the lessons: a changed stored output makes it fail."""

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
LESSON = ROOT / "notebooks" / "01_toy_model_parallel.ipynb"
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


def _tamper(nb: dict) -> int:
    """Turn lesson 01's first stored proof verdict OK into FAILED; its code-cell index."""
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for index, cell in enumerate(code):
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", []))
            if "max |diff|" in text and "OK" in text:
                out["text"] = [text.replace("OK", "FAILED", 1)]
                return index
    raise AssertionError("lesson 01 has no stored proof output to tamper with")


@pytest.mark.slow  # a subprocess that runs a lesson under nbval
def test_only_a_tampered_output_fails_on_one_core_in_a_foreign_env(tmp_path):
    """One run of lesson 01 under nbval, as make test runs it (conftest.py and the sanitizer
    copied beside it), on one CPU core with TUTORIAL_PROFILE=full and a GPU asked for:
    every cell passes (conftest forces the stored outputs' profile and the CPU) except the
    one whose stored verdict was changed, which nbval reports."""
    nb = json.loads(LESSON.read_text())
    tampered = _tamper(nb)
    copy = tmp_path / LESSON.name
    copy.write_text(json.dumps(nb))
    shutil.copy(SANITIZE, tmp_path)
    shutil.copy(ROOT / "conftest.py", tmp_path)
    cmd = [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
           "--nbval-sanitize-with", SANITIZE.name, "-p", "no:cacheprovider", "-o", "addopts=",
           "--rootdir", str(tmp_path), "-rf", copy.name]  # fmt: skip
    env = {**os.environ, "TUTORIAL_PROFILE": "full", "CUDA_VISIBLE_DEVICES": "0"}
    result = subprocess.run(
        cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
    )  # fmt: skip
    summary = re.search(r"(\d+) failed, (\d+) passed", result.stdout)
    assert result.returncode != 0 and summary, result.stdout[-3000:]
    code_cells = sum(c["cell_type"] == "code" for c in nb["cells"])
    assert (int(summary[1]), int(summary[2])) == (1, code_cells - 1), result.stdout[-3000:]
    assert f"FAILED {copy.name}::Cell {tampered}" in result.stdout, result.stdout[-3000:]


def test_sanitizer_hides_rounding_not_verdicts():
    cfg = ConfigParser()
    cfg.read(SANITIZE, encoding="utf-8")
    text = "loss max |diff| ≈ 3.1e-07   OK (tolerance 1e-05) at 0x7f3a2b1c4d50"
    for section in cfg.sections():
        text = re.sub(cfg[section]["regex"], cfg[section]["replace"], text)
    assert text == "loss max |diff| ≈ VALUE   OK (tolerance 1e-05) at 0xADDRESS"
