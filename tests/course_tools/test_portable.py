
"""The stored outputs compare equal on any learner's machine: other cores, builds, env."""

import re
from configparser import ConfigParser
from pathlib import Path

from helpers.core.devices import MachineInfo

ROOT = Path(__file__).resolve().parents[2]
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


# A notebook passing nbval on one core with a foreign environment (TUTORIAL_PROFILE=full, a
# visible GPU asked for) is tested with nbval's guard, on a lesson in miniature:
# tests/course_tools/test_nbval_guard.py::test_only_a_tampered_output_fails_on_one_core_in_a_foreign_env
