"""The reference solutions in ``solutions/``: shown on request, loaded by the tests.

Each lesson has one file, ``solutions/<lesson>.py``, split into sections that start with
``# %% Exercise NN.k`` (the cell marker editors such as VS Code and Jupytext understand)
and a dict ``ANSWERS`` from exercise to the answer it defines.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from helpers.core.paths import REPO_ROOT
from helpers.core.show import Source

SOLUTIONS_DIR = REPO_ROOT / "solutions"
_ID = re.compile(r"^(\d\d)\.(\d+)$")
_SECTION = re.compile(r"^# %% Exercise (\d\d\.\d+)\b.*$", re.MULTILINE)


def _check_id(exercise: str) -> str:
    if not isinstance(exercise, str) or not _ID.match(exercise):
        raise ValueError(f"exercise={exercise!r}; valid: 'NN.k', e.g. '01.1' (lesson 01, exercise 1)")
    return exercise


def solution_file(exercise: str) -> Path:
    """The file holding ``exercise``'s solution (``solutions/NN_*.py``)."""
    lesson = _check_id(exercise)[:2]
    files = sorted(SOLUTIONS_DIR.glob(f"{lesson}_*.py"))
    if len(files) != 1:
        valid = ", ".join(sorted(p.name for p in SOLUTIONS_DIR.glob("[0-9][0-9]_*.py")))
        raise ValueError(f"no single solutions file for lesson {lesson} (found {len(files)}); "
                         f"valid files: {valid}")
    return files[0]


def sections(path: Path) -> dict[str, str]:
    """Exercise id -> the text of its section in a solutions file (``ANSWERS`` left out)."""
    text = path.read_text(encoding="utf-8").split("\nANSWERS = ")[0]
    marks = list(_SECTION.finditer(text))
    ends = [m.start() for m in marks[1:]] + ([len(text)] if marks else [])
    return {m.group(1): text[m.start():end].rstrip() + "\n"
            for m, end in zip(marks, ends, strict=True)}


def show_solution(exercise: str) -> Source:
    """The reference solution of ``exercise`` (e.g. ``"03.1"``), highlighted."""
    path = solution_file(exercise)
    found = sections(path)
    if exercise not in found:
        raise ValueError(f"{path.name} has no exercise {exercise!r}; valid: {', '.join(found)}")
    return Source(found[exercise])


def load_solutions(lesson: str) -> ModuleType:
    """Import ``solutions/<lesson>_*.py`` (its name starts with a digit, so not by ``import``)."""
    path = solution_file(f"{lesson}.1")
    spec = importlib.util.spec_from_file_location(f"solutions_{lesson}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_solution(exercise: str) -> object:
    """The answer the solutions file gives for ``exercise``."""
    module = load_solutions(_check_id(exercise)[:2])
    if exercise not in module.ANSWERS:
        raise ValueError(f"no answer for {exercise!r}; valid: {', '.join(module.ANSWERS)}")
    return module.ANSWERS[exercise]
