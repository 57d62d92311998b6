"""Each topic package says what it teaches, and the lessons agree.

A topic package's ``__init__`` declares ``TAUGHT``: the modules whose code a lesson shows
(``show_source``) or imports as the idea itself. These tests keep that list equal to what
the notebooks do, and keep the technique packages free of run machinery: every other
module of a package is one its taught modules build on, and none is a worker, config,
launch, results or report module (those live in ``helpers/runs/<lesson>/``).
"""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

from course_tools.run_notebooks import lessons

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ("models", "comm", "model_parallel", "pipeline", "placement", "data_parallel",
          "tensor_parallel", "context_parallel", "expert_parallel", "debugging", "composed",
          "memory")
HARNESS = re.compile(r"(^|_)(worker|config|launch|launches|results?|report|runs?)$")


def notebook_code() -> list[str]:
    cells = []
    for nb in lessons():
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] == "code":
                text = "".join(cell["source"])
                cells.append("\n".join(ln for ln in text.splitlines()
                                       if not ln.lstrip().startswith(("%", "!"))))
    return cells


def package_modules(package: str) -> set[str]:
    folder = ROOT / "helpers" / package
    return {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}


def used_by_lessons() -> dict[str, set[str]]:
    """Per topic package, the modules the notebooks import from (or import whole)."""
    used: dict[str, set[str]] = {p: set() for p in TOPICS}
    for code in notebook_code():
        for node in ast.walk(ast.parse(code)):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                parts = name.split(".")
                if len(parts) >= 3 and parts[0] == "helpers" and parts[1] in used:
                    if parts[2] in package_modules(parts[1]):
                        used[parts[1]].add(parts[2])
    return used


def taught(package: str) -> tuple[str, ...]:
    return importlib.import_module(f"helpers.{package}").TAUGHT


@pytest.mark.parametrize("package", TOPICS)
def test_taught_list_is_what_the_lessons_use(package: str) -> None:
    declared = set(taught(package))
    used = used_by_lessons()[package]
    assert declared == used, (
        f"helpers.{package}.TAUGHT is {sorted(declared)} but the notebooks show or import "
        f"{sorted(used)}: missing {sorted(used - declared)}, never used {sorted(declared - used)}")


def imported_from(package: str, paths: list[Path]) -> set[str]:
    """The modules of ``helpers.<package>`` that the files ``paths`` import."""
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                for name in [node.module] + [f"{node.module}.{a.name}" for a in node.names]:
                    parts = name.split(".")
                    if parts[:2] == ["helpers", package] and len(parts) > 2:
                        found.add(parts[2])
    return found & package_modules(package)


@pytest.mark.parametrize("package", TOPICS)
def test_every_module_is_taught_or_built_on(package: str) -> None:
    """A module no lesson shows must be one that a taught module, or a lesson's run
    (``helpers/runs/``), builds on: nothing in a topic package is unused."""
    modules = package_modules(package)
    runs = sorted((ROOT / "helpers" / "runs").rglob("*.py"))
    reached = set(taught(package)) | imported_from(package, runs)
    frontier = list(reached)
    while frontier:
        source = (ROOT / "helpers" / package / f"{frontier.pop()}.py").read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                for name in names:
                    parts = name.split(".")
                    if parts[:2] == ["helpers", package] and len(parts) > 2:
                        if parts[2] in modules and parts[2] not in reached:
                            reached.add(parts[2])
                            frontier.append(parts[2])
    assert modules == reached, f"helpers.{package}: unused by any lesson {sorted(modules - reached)}"


@pytest.mark.parametrize("package", TOPICS)
def test_no_run_machinery_in_a_topic_package(package: str) -> None:
    harness = sorted(m for m in package_modules(package) if HARNESS.search(m))
    assert not harness, f"helpers.{package} holds run machinery {harness}; move it to helpers/runs/"


@pytest.mark.parametrize("package", TOPICS)
def test_docstring_names_the_taught_modules(package: str) -> None:
    doc = importlib.import_module(f"helpers.{package}").__doc__ or ""
    missing = [m for m in taught(package) if f"``{m}``" not in doc]
    assert not missing, f"helpers.{package}'s docstring does not say what {missing} teach"
