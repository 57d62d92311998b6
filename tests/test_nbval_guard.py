"""nbval really guards the lessons: a changed stored output makes it fail."""

import json
import re
import shutil
import subprocess
import sys
from configparser import ConfigParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSON = ROOT / "notebooks" / "01_toy_model_parallel.ipynb"
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


def _run_nbval(path: Path) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--nbval",
        "--nbval-current-env",
        "--nbval-sanitize-with",
        str(SANITIZE),
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--rootdir",
        str(path.parent),
        str(path),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=path.parent, timeout=600)


@pytest.mark.slow  # a subprocess that starts Python with torch (or a notebook)
def test_tampered_output_fails(tmp_path):
    nb = json.loads(LESSON.read_text())
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if "max |diff|" in "".join(out.get("text", [])):
                out["text"] = ["".join(out["text"]).replace("OK", "FAILED", 1)]
                break
        else:
            continue
        break
    else:
        raise AssertionError("lesson 01 has no stored proof output to tamper with")
    copy = tmp_path / LESSON.name
    copy.write_text(json.dumps(nb))
    shutil.copy(SANITIZE, tmp_path)
    result = _run_nbval(copy)
    assert result.returncode != 0, result.stdout[-2000:]
    assert "mismatch" in result.stdout.lower() or "failed" in result.stdout.lower()


def test_sanitizer_hides_rounding_not_verdicts():
    cfg = ConfigParser()
    cfg.read(SANITIZE, encoding="utf-8")
    text = "loss max |diff| ≈ 3.1e-07   OK (tolerance 1e-05) at 0x7f3a2b1c4d50"
    for section in cfg.sections():
        text = re.sub(cfg[section]["regex"], cfg[section]["replace"], text)
    assert text == "loss max |diff| ≈ VALUE   OK (tolerance 1e-05) at 0xADDRESS"
